//! File names held in one buffer.
//!
//! An apply of the dir sink holds two sets of file names: those its manifest says it
//! wrote, and those the bundle wants. For a bundle of 100,000 small resources, a
//! `String` each in a sorted tree cost about three times the names' own bytes (an
//! allocation per name, a tree node per few names), more than the bundle itself
//! held in memory. [`Names`] keeps them in one `String`, with an index sorted by name.

use std::cmp::Ordering;
use std::fmt;
use std::iter::Peekable;

use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// Names in the order they were added, and an index of them in name order (a name
/// added twice is listed there once). [`Names::index`] makes the index; until then
/// [`Names::contains`] and [`Names::sorted`] see no name.
#[derive(Debug, Default)]
pub(super) struct Names {
    text: String,
    /// Where each name ends in `text`, in the order added.
    ends: Vec<usize>,
    /// Positions in `ends`, in name order.
    by_name: Vec<usize>,
}

impl Names {
    pub(super) fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `index`-th name added.
    pub(super) fn get(&self, index: usize) -> &str {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1],
        };
        &self.text[start..self.ends[index]]
    }

    /// Sorts the index by name, each name once, and gives back what the buffers
    /// reserved beyond what they hold.
    pub(super) fn index(&mut self) {
        let mut by_name: Vec<usize> = (0..self.ends.len()).collect();
        by_name.sort_by(|&a, &b| self.get(a).cmp(self.get(b)));
        by_name.dedup_by(|a, b| self.get(*a) == self.get(*b));
        self.by_name = by_name;
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.by_name.shrink_to_fit();
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.by_name
            .binary_search_by(|&i| self.get(i).cmp(name))
            .is_ok()
    }

    /// Each name once, in name order.
    pub(super) fn sorted(&self) -> impl Iterator<Item = &str> + Clone {
        self.by_name.iter().map(|&i| self.get(i))
    }
}

impl<'de> Deserialize<'de> for Names {
    /// A list of names, indexed.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Names, D::Error> {
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = Names;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of file names")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Names, A::Error> {
                let mut names = Names::default();
                while seq.next_element_seed(Pushed(&mut names))?.is_some() {}
                names.index();
                Ok(names)
            }
        }
        deserializer.deserialize_seq(List)
    }
}

/// Reads one name straight into [`Names`], without a `String` of its own.
struct Pushed<'n>(&'n mut Names);

impl<'de> DeserializeSeed<'de> for Pushed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Pushed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a file name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<(), E> {
        self.0.push(name);
        Ok(())
    }
}

/// The names of two iterators that each give names in order without repeats, in
/// order without repeats.
pub(super) fn union<'a>(
    a: impl Iterator<Item = &'a str>,
    b: impl Iterator<Item = &'a str>,
) -> impl Iterator<Item = &'a str> {
    Union {
        a: a.peekable(),
        b: b.peekable(),
    }
}

struct Union<A: Iterator, B: Iterator> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<'a, A: Iterator<Item = &'a str>, B: Iterator<Item = &'a str>> Iterator for Union<A, B> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let order = match (self.a.peek(), self.b.peek()) {
            (Some(a), Some(b)) => a.cmp(b),
            (Some(_), None) => Ordering::Less,
            (None, _) => Ordering::Greater,
        };
        match order {
            Ordering::Less => self.a.next(),
            Ordering::Greater => self.b.next(),
            Ordering::Equal => {
                self.b.next();
                self.a.next()
            }
        }
    }
}

/// Serialises the names a function gives as a list, without collecting them.
pub(super) struct Listed<F>(pub(super) F);

impl<'a, F, I> Serialize for Listed<F>
where
    F: Fn() -> I,
    I: Iterator<Item = &'a str>,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq((self.0)())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Names {
        let mut names = Names::default();
        for name in list {
            names.push(name);
        }
        names.index();
        names
    }

    #[test]
    fn keeps_the_order_added_and_finds_each_name_once_in_name_order() {
        let names = names(&["b.yaml", "a.yaml", "c.yaml", "a.yaml", ""]);
        let added: Vec<&str> = (0..5).map(|i| names.get(i)).collect();
        assert_eq!(added, ["b.yaml", "a.yaml", "c.yaml", "a.yaml", ""]);
        let sorted: Vec<&str> = names.sorted().collect();
        assert_eq!(sorted, ["", "a.yaml", "b.yaml", "c.yaml"]);
        for name in ["", "a.yaml", "b.yaml", "c.yaml"] {
            assert!(names.contains(name), "{name}");
        }
        for name in ["a", "a.yam", "a.yaml.", "d.yaml"] {
            assert!(!names.contains(name), "{name}");
        }
    }

    #[test]
    fn a_union_of_sorted_lists_is_sorted_and_repeats_nothing() {
        let a = names(&["a", "c", "e", "f"]);
        let b = names(&["b", "c", "f", "g", "h"]);
        let both: Vec<&str> = union(a.sorted(), b.sorted()).collect();
        assert_eq!(both, ["a", "b", "c", "e", "f", "g", "h"]);
        assert_eq!(union(a.sorted(), std::iter::empty()).count(), 4);
        assert_eq!(union(std::iter::empty(), b.sorted()).count(), 5);
    }

    #[test]
    fn reads_and_writes_a_json_list() {
        let read: Names = serde_json::from_str(r#"["z", "a\nb", "z"]"#).expect("reads");
        assert_eq!(read.sorted().collect::<Vec<_>>(), ["a\nb", "z"]);
        let written = serde_json::to_string(&Listed(|| read.sorted())).expect("writes");
        assert_eq!(written, r#"["a\nb","z"]"#);
        assert!(serde_json::from_str::<Names>(r#"{"a": 1}"#).is_err());
    }
}
