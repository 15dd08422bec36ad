//! Sprig's and Helm's template functions. (being written)
