//! PEM as Go's `encoding/pem` writes it (64 columns, `\n` line ends) and reads it:
//! the first well-formed block, wherever it starts, with any text around it and
//! optional `Key: value` headers ignored.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A decoded PEM block: its type (`RSA PRIVATE KEY`, `CERTIFICATE`, ...) and DER bytes.
pub struct Block {
    pub label: String,
    pub der: Vec<u8>,
}

pub fn encode(label: &str, der: &[u8]) -> String {
    let mut out = String::with_capacity(der.len() * 4 / 3 + der.len() / 48 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    // 48 bytes are 64 base64 characters: one line each, as Go wraps them.
    for line in der.chunks(48) {
        STANDARD.encode_string(line, &mut out);
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// The first PEM block of `text` that decodes, as Go's `pem.Decode` finds it.
pub fn decode(text: &str) -> Option<Block> {
    let mut search_from = 0;
    while let Some(found) = text[search_from..].find("-----BEGIN ") {
        let start = search_from + found;
        search_from = start + 1;
        if start > 0 && !text[..start].ends_with('\n') {
            continue;
        }
        if let Some(block) = decode_block_at(&text[start + "-----BEGIN ".len()..]) {
            return Some(block);
        }
    }
    None
}

fn decode_block_at(rest: &str) -> Option<Block> {
    let (type_line, after) = rest.split_once('\n').unwrap_or((rest, ""));
    let label = type_line.trim_end().strip_suffix("-----")?;
    let end_marker = format!("-----END {label}-----");
    let end = if after.starts_with(&end_marker) {
        0
    } else {
        after.find(&format!("\n{end_marker}"))?
    };
    let mut body = &after[..end];
    // Headers (`Proc-Type: 4,ENCRYPTED`, ...) end at a blank line; the keys Sprig
    // reads have none, but Go skips them, so skip them too.
    if body.lines().next().is_some_and(|line| line.contains(':')) {
        body = body.split_once("\n\n").map_or("", |(_, b)| b);
    }
    let base64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let der = STANDARD.decode(base64).ok()?;
    Some(Block {
        label: label.to_string(),
        der,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_64_columns_and_reads_back_with_text_around() {
        let der: Vec<u8> = (0..=255).collect();
        let pem = encode("CERTIFICATE", &der);
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert!(pem.ends_with("\n-----END CERTIFICATE-----\n"));
        assert!(pem.lines().all(|line| line.len() <= 64));
        let wrapped = format!("junk\n{pem}trailing");
        let block = decode(&wrapped).expect("a block");
        assert_eq!(block.label, "CERTIFICATE");
        assert_eq!(block.der, der);
    }

    #[test]
    fn a_broken_block_is_skipped_for_the_next() {
        let text = format!(
            "-----BEGIN X-----\n!!!\n-----END X-----\n{}",
            encode("Y", b"ok")
        );
        let block = decode(&text).expect("the second block");
        assert_eq!(
            (block.label.as_str(), block.der.as_slice()),
            ("Y", &b"ok"[..])
        );
        assert!(decode("no pem here").is_none());
    }
}
