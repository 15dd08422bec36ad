//! Sprig's `encryptAES`, `decryptAES` and `derivePassword`.

use aes::cipher::{BlockDecryptMut as _, BlockEncryptMut as _, KeyIvInit as _};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::Mac as _;

type Encryptor = cbc::Encryptor<aes::Aes256>;
type Decryptor = cbc::Decryptor<aes::Aes256>;

const BLOCK: usize = 16;

/// Sprig's key: the password's bytes in 32 zero bytes, cut at 32 (always AES-256).
fn aes_key(password: &str) -> [u8; 32] {
    let mut key = [0u8; 32];
    let bytes = password.as_bytes();
    let len = bytes.len().min(32);
    key[..len].copy_from_slice(&bytes[..len]);
    key
}

/// AES-256-CBC with PKCS#7 padding; the IV first, all in standard base64. An empty
/// plaintext gives an empty string, as in Sprig.
pub fn encrypt_aes(password: &str, plaintext: &str, iv: [u8; BLOCK]) -> String {
    if plaintext.is_empty() {
        return String::new();
    }
    let padding = BLOCK - plaintext.len() % BLOCK;
    let mut content = plaintext.as_bytes().to_vec();
    content.resize(content.len() + padding, padding as u8);
    let mut out = iv.to_vec();
    let mut encryptor = Encryptor::new(&aes_key(password).into(), &iv.into());
    for block in content.chunks_exact(BLOCK) {
        let mut block = aes::Block::clone_from_slice(block);
        encryptor.encrypt_block_mut(&mut block);
        out.extend_from_slice(&block);
    }
    STANDARD.encode(out)
}

/// The inverse of [`encrypt_aes`]. Sprig checks nothing: short or ragged input makes Go
/// panic, which the template engine reports; these are the same messages. The
/// padding is removed as its last byte says, unchecked, as Sprig does; bytes that are
/// not UTF-8 (a wrong password) are replaced, as a Rust string must be valid.
pub fn decrypt_aes(password: &str, encoded: &str) -> Result<String, String> {
    if encoded.is_empty() {
        return Ok(String::new());
    }
    let crypt = go_base64_decode(encoded)?;
    if crypt.len() < BLOCK {
        return Err(format!(
            "runtime error: slice bounds out of range [:16] with capacity {}",
            crypt.len()
        ));
    }
    let (iv, body) = crypt.split_at(BLOCK);
    if body.len() % BLOCK != 0 {
        return Err("crypto/cipher: input not full blocks".to_string());
    }
    let mut decryptor = Decryptor::new(&aes_key(password).into(), iv.into());
    let mut decrypted = Vec::with_capacity(body.len());
    for block in body.chunks_exact(BLOCK) {
        let mut block = aes::Block::clone_from_slice(block);
        decryptor.decrypt_block_mut(&mut block);
        decrypted.extend_from_slice(&block);
    }
    let Some(&last) = decrypted.last() else {
        return Err("runtime error: index out of range [-1]".to_string());
    };
    let Some(end) = decrypted.len().checked_sub(usize::from(last)) else {
        return Err(format!(
            "runtime error: slice bounds out of range [:{}]",
            decrypted.len() as i64 - i64::from(last)
        ));
    };
    decrypted.truncate(end);
    Ok(String::from_utf8_lossy(&decrypted).into_owned())
}

/// Go's `base64.StdEncoding.DecodeString`: newlines are ignored, and an error names
/// the offset of the quantum that is wrong.
pub fn go_base64_decode(encoded: &str) -> Result<Vec<u8>, String> {
    let cleaned: String = encoded
        .chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .collect();
    STANDARD.decode(&cleaned).map_err(|e| {
        let offset = match e {
            base64::DecodeError::InvalidByte(offset, _)
            | base64::DecodeError::InvalidLastSymbol(offset, _) => offset,
            base64::DecodeError::InvalidLength(len) => len / 4 * 4,
            base64::DecodeError::InvalidPadding => cleaned.len() / 4 * 4,
        };
        format!("illegal base64 data at input byte {offset}")
    })
}

const MASTER_PASSWORD_SEED: &str = "com.lyndir.masterpassword";

fn templates(password_type: &str) -> Option<&'static [&'static str]> {
    Some(match password_type {
        "maximum" => &["anoxxxxxxxxxxxxxxxxx", "axxxxxxxxxxxxxxxxxno"],
        "long" => &[
            "CvcvnoCvcvCvcv",
            "CvcvCvcvnoCvcv",
            "CvcvCvcvCvcvno",
            "CvccnoCvcvCvcv",
            "CvccCvcvnoCvcv",
            "CvccCvcvCvcvno",
            "CvcvnoCvccCvcv",
            "CvcvCvccnoCvcv",
            "CvcvCvccCvcvno",
            "CvcvnoCvcvCvcc",
            "CvcvCvcvnoCvcc",
            "CvcvCvcvCvccno",
            "CvccnoCvccCvcv",
            "CvccCvccnoCvcv",
            "CvccCvccCvcvno",
            "CvcvnoCvccCvcc",
            "CvcvCvccnoCvcc",
            "CvcvCvccCvccno",
            "CvccnoCvcvCvcc",
            "CvccCvcvnoCvcc",
            "CvccCvcvCvccno",
        ],
        "medium" => &["CvcnoCvc", "CvcCvcno"],
        "short" => &["Cvcn"],
        "basic" => &["aaanaaan", "aannaaan", "aaannaaa"],
        "pin" => &["nnnn"],
        _ => return None,
    })
}

fn template_characters(class: u8) -> &'static [u8] {
    match class {
        b'V' => b"AEIOU",
        b'C' => b"BCDFGHJKLMNPQRSTVWXYZ",
        b'v' => b"aeiou",
        b'c' => b"bcdfghjklmnpqrstvwxyz",
        b'A' => b"AEIOUBCDFGHJKLMNPQRSTVWXYZ",
        b'a' => b"AEIOUaeiouBCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz",
        b'n' => b"0123456789",
        b'o' => b"@&%?,=[]_:-+*$#!'^~;()/.",
        _ => b"AEIOUaeiouBCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz0123456789!@#$%^&*()",
    }
}

/// The Master Password algorithm, as Sprig's `derivePassword`: scrypt (N 32768, r 8,
/// p 2) of the password salted with the user, then HMAC-SHA256 over the site and
/// counter picks a template and its characters. Sprig returns its failures as the
/// function's text, and so does this.
pub fn derive_password(
    counter: u32,
    password_type: &str,
    password: &str,
    user: &str,
    site: &str,
) -> String {
    let Some(templates) = templates(password_type) else {
        return format!("cannot find password template {password_type}");
    };
    let with_length = |text: &str| {
        let mut out = MASTER_PASSWORD_SEED.as_bytes().to_vec();
        out.extend_from_slice(&(text.len() as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    };
    let salt = with_length(user);
    let mut key = [0u8; 64];
    let derived = scrypt::Params::new(15, 8, 2, 64)
        .map_err(|e| e.to_string())
        .and_then(|params| {
            scrypt::scrypt(password.as_bytes(), &salt, &params, &mut key).map_err(|e| e.to_string())
        });
    if let Err(e) = derived {
        return format!("failed to derive password: {e}");
    }
    let mut message = with_length(site);
    message.extend_from_slice(&counter.to_be_bytes());
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key) else {
        return "failed to derive password: HMAC key rejected".to_string();
    };
    mac.update(&message);
    let seed = mac.finalize().into_bytes();
    let template = templates[usize::from(seed[0]) % templates.len()];
    template
        .bytes()
        .zip(seed.iter().skip(1))
        .map(|(class, byte)| {
            let characters = template_characters(class);
            char::from(characters[usize::from(*byte) % characters.len()])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_round_trips_and_writes_the_iv_first() {
        let iv = [7u8; 16];
        let encrypted = encrypt_aes("k", "hello, world", iv);
        let bytes = STANDARD.decode(&encrypted).expect("base64");
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[..16], &iv);
        assert_eq!(decrypt_aes("k", &encrypted).as_deref(), Ok("hello, world"));
        // A whole block of padding when the text fills its blocks.
        let full = encrypt_aes("k", "0123456789abcdef", iv);
        assert_eq!(STANDARD.decode(&full).expect("base64").len(), 48);
        assert_eq!(decrypt_aes("k", &full).as_deref(), Ok("0123456789abcdef"));
        assert_eq!(encrypt_aes("k", "", iv), "");
        assert_eq!(decrypt_aes("k", "").as_deref(), Ok(""));
    }

    #[test]
    fn aes_decrypts_what_helm_encrypted() {
        // Checked against Helm v4: `encryptAES "secretkey" "plaintext"` gave this once
        // (its IV is random); `decryptAES` must read it back.
        let from_helm = "Qc0Ty20a/YgGWbZJeO2MsJGJpAzndogt7+0gpszYm/U=";
        assert_eq!(
            decrypt_aes("secretkey", from_helm).as_deref(),
            Ok("plaintext")
        );
    }

    #[test]
    fn bad_ciphertexts_fail_with_gos_messages() {
        // Each message as Helm v4 reported it.
        assert_eq!(
            decrypt_aes("k", "abc"),
            Err("illegal base64 data at input byte 0".to_string())
        );
        assert_eq!(
            decrypt_aes("k", "YWJj"),
            Err("runtime error: slice bounds out of range [:16] with capacity 3".to_string())
        );
        assert_eq!(
            decrypt_aes("k", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err("runtime error: slice bounds out of range [:-19]".to_string())
        );
    }

    #[test]
    fn derive_password_matches_helm() {
        // Checked against Helm v4.
        assert_eq!(
            derive_password(1, "long", "password", "user", "example.com"),
            "ZedaFaxcZaso9*"
        );
        assert_eq!(
            derive_password(7, "pin", "pässword", "üser", "site"),
            "4581"
        );
        assert_eq!(
            derive_password(1, "x", "password", "user", "example.com"),
            "cannot find password template x"
        );
    }
}
