//! Private keys as Sprig makes and reads them: generated from a 32-byte seed (so the
//! same render makes the same key), written in the PEM block Sprig's `pemBlockForKey`
//! chooses, read back from any of the PEM forms Sprig's `parsePrivateKeyPEM` accepts,
//! and used to sign certificates the way Go's `x509.CreateCertificate` does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ed25519_dalek::pkcs8::DecodePrivateKey as _;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore as _, SeedableRng as _};
use rsa::RsaPrivateKey;
use rsa::pkcs1::{DecodeRsaPrivateKey as _, EncodeRsaPrivateKey as _};
use rsa::pkcs8::PrivateKeyInfo;
use rsa::signature::{SignatureEncoding as _, Signer as _};
use rsa::traits::PublicKeyParts as _;

use super::der::{
    TAG_NULL, bit_string, constructed, octet_string, sequence, tlv, unsigned_integer,
};
use super::pem;

/// Object identifiers, as whole DER elements.
pub mod oid {
    pub const RSA_ENCRYPTION: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    pub const SHA256_WITH_RSA: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b,
    ];
    pub const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    pub const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    pub const ECDSA_WITH_SHA256: &[u8] =
        &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    pub const ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
}

/// The key types `genPrivateKey` makes, and the RSA keys the certificate functions make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    Rsa {
        bits: usize,
    },
    /// DSA with 2048-bit `p` and 256-bit `q` (Go's `dsa.L2048N256`).
    Dsa,
    EcdsaP256,
    Ed25519,
}

/// A private key of one of the types Sprig handles.
#[derive(Debug)]
pub enum PrivateKey {
    Rsa(Box<RsaPrivateKey>),
    EcdsaP256(p256::SecretKey),
    Ed25519(ed25519_dalek::SigningKey),
    /// DSA keys are made and read, but Go cannot sign certificates with them.
    Dsa(DsaKey),
}

/// A DSA key's numbers, big-endian, in the order of OpenSSL's "DSA PRIVATE KEY".
#[derive(Debug)]
pub struct DsaKey {
    p: Vec<u8>,
    q: Vec<u8>,
    g: Vec<u8>,
    y: Vec<u8>,
    x: Vec<u8>,
}

/// Why a key could not be made or used: the message Go would give, where it gives one.
pub type KeyError = String;

/// The RSA keys this process made, by size and seed, and the bytes their numbers take.
type KeptRsaKeys = (HashMap<(usize, [u8; 32]), Arc<RsaPrivateKey>>, usize);

/// At most this many bytes of RSA numbers are kept (about 29,000 keys of 4,096 bits,
/// 58,000 of 2,048; the maps and allocations around them come on top); when full,
/// the kept keys are dropped and kept anew.
const RSA_KEPT_BYTES: usize = 64 << 20;

/// The RSA key of `bits` bits from ChaCha20 seeded with `seed`, made once per process:
/// a release rendered again (new values, a new chart version, a render process
/// started over a fleet it rendered) makes the same calls with the same seeds, and a
/// key takes about 0.1 s (2,048 bits) to 1 s (4,096) to find in a release build. The
/// keys are those the seed gives whoever holds it; the render process holds the seed.
fn rsa_key(bits: usize, seed: [u8; 32]) -> rsa::Result<Arc<RsaPrivateKey>> {
    static KEPT: Mutex<Option<KeptRsaKeys>> = Mutex::new(None);
    let kept = || KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((keys, _)) = kept().as_ref()
        && let Some(key) = keys.get(&(bits, seed))
    {
        return Ok(Arc::clone(key));
    }
    let key = Arc::new(super::primes::generate(
        &mut ChaCha20Rng::from_seed(seed),
        bits,
    )?);
    // n, d, two primes and three numbers of half their size each.
    let bytes = bits.div_ceil(8) * 9 / 2;
    let mut kept = kept();
    let (keys, total) = kept.get_or_insert_with(Default::default);
    if *total + bytes > RSA_KEPT_BYTES {
        keys.clear();
        *total = 0;
    }
    if keys.insert((bits, seed), Arc::clone(&key)).is_none() {
        *total += bytes;
    }
    Ok(key)
}

impl PrivateKey {
    /// Generates a key of `kind` from ChaCha20 seeded with `seed`: the same seed always
    /// gives the same key (with this build's crates). This pure function of
    /// `(kind, seed)` keeps the RSA keys it made (see [`rsa_key`]).
    pub fn generate(kind: KeyKind, seed: [u8; 32]) -> Result<PrivateKey, KeyError> {
        let mut rng = ChaCha20Rng::from_seed(seed);
        match kind {
            KeyKind::Rsa { bits } => rsa_key(bits, seed)
                .map(|key| PrivateKey::Rsa(Box::new(RsaPrivateKey::clone(&key))))
                .map_err(|e| e.to_string()),
            KeyKind::Dsa => {
                let components = dsa::Components::generate(&mut rng, dsa::KeySize::DSA_2048_256);
                let key = dsa::SigningKey::generate(&mut rng, components);
                let public = key.verifying_key();
                Ok(PrivateKey::Dsa(DsaKey {
                    p: public.components().p().to_bytes_be(),
                    q: public.components().q().to_bytes_be(),
                    g: public.components().g().to_bytes_be(),
                    y: public.y().to_bytes_be(),
                    x: key.x().to_bytes_be(),
                }))
            }
            KeyKind::EcdsaP256 => Ok(PrivateKey::EcdsaP256(p256::SecretKey::random(&mut rng))),
            KeyKind::Ed25519 => {
                let mut secret = [0u8; 32];
                rng.fill_bytes(&mut secret);
                Ok(PrivateKey::Ed25519(ed25519_dalek::SigningKey::from_bytes(
                    &secret,
                )))
            }
        }
    }

    /// The key in the PEM block Sprig writes for its type: PKCS#1 `RSA PRIVATE KEY`,
    /// SEC 1 `EC PRIVATE KEY`, OpenSSL's `DSA PRIVATE KEY`, PKCS#8 `PRIVATE KEY` for
    /// Ed25519.
    pub fn to_pem(&self) -> Result<String, KeyError> {
        Ok(match self {
            PrivateKey::Rsa(key) => {
                let der = key.to_pkcs1_der().map_err(|e| e.to_string())?;
                pem::encode("RSA PRIVATE KEY", der.as_bytes())
            }
            PrivateKey::EcdsaP256(key) => {
                // Go's MarshalECPrivateKey: version 1, the scalar padded to 32 bytes,
                // the curve, and the uncompressed public point.
                let scalar = key.to_bytes();
                let point = key.public_key().to_encoded_point(false);
                let der = sequence(&[
                    &unsigned_integer(&[1]),
                    &octet_string(&scalar),
                    &constructed(0xa0, &[oid::P256]),
                    &constructed(0xa1, &[&bit_string(point.as_bytes())]),
                ]);
                pem::encode("EC PRIVATE KEY", &der)
            }
            PrivateKey::Ed25519(key) => {
                // Go's MarshalPKCS8PrivateKey: version 0 and the seed, no public key.
                let der = sequence(&[
                    &unsigned_integer(&[0]),
                    &sequence(&[oid::ED25519]),
                    &octet_string(&octet_string(key.as_bytes())),
                ]);
                pem::encode("PRIVATE KEY", &der)
            }
            PrivateKey::Dsa(key) => {
                let der = sequence(&[
                    &unsigned_integer(&[0]),
                    &unsigned_integer(&key.p),
                    &unsigned_integer(&key.q),
                    &unsigned_integer(&key.g),
                    &unsigned_integer(&key.y),
                    &unsigned_integer(&key.x),
                ]);
                pem::encode("DSA PRIVATE KEY", &der)
            }
        })
    }

    /// The public key as an X.509 SubjectPublicKeyInfo, and the bits of its
    /// `subjectPublicKey` (what the subject key identifier hashes).
    pub fn public_key_info(&self) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        let (algorithm, bits) = match self {
            PrivateKey::Rsa(key) => (
                sequence(&[oid::RSA_ENCRYPTION, &tlv(TAG_NULL, &[])]),
                sequence(&[
                    &unsigned_integer(&key.n().to_bytes_be()),
                    &unsigned_integer(&key.e().to_bytes_be()),
                ]),
            ),
            PrivateKey::EcdsaP256(key) => (
                sequence(&[oid::EC_PUBLIC_KEY, oid::P256]),
                key.public_key().to_encoded_point(false).as_bytes().to_vec(),
            ),
            PrivateKey::Ed25519(key) => (
                sequence(&[oid::ED25519]),
                key.verifying_key().as_bytes().to_vec(),
            ),
            PrivateKey::Dsa(_) => {
                return Err("x509: unsupported public key type: *dsa.PublicKey".to_string());
            }
        };
        Ok((sequence(&[&algorithm, &bit_string(&bits)]), bits))
    }

    /// Whether Go can sign with this key (its `crypto.Signer`): all but DSA.
    pub fn check_signer(&self) -> Result<(), KeyError> {
        match self {
            PrivateKey::Dsa(_) => {
                Err("x509: certificate private key does not implement crypto.Signer".to_string())
            }
            _ => Ok(()),
        }
    }

    /// The signature algorithm Go picks for the key (SHA-256 with RSA PKCS#1 v1.5,
    /// ECDSA with SHA-256, pure Ed25519), as an AlgorithmIdentifier.
    pub fn signature_algorithm(&self) -> Result<Vec<u8>, KeyError> {
        self.check_signer()?;
        Ok(match self {
            PrivateKey::Rsa(_) => sequence(&[oid::SHA256_WITH_RSA, &tlv(TAG_NULL, &[])]),
            PrivateKey::EcdsaP256(_) => sequence(&[oid::ECDSA_WITH_SHA256]),
            PrivateKey::Ed25519(_) | PrivateKey::Dsa(_) => sequence(&[oid::ED25519]),
        })
    }

    /// Signs `message` deterministically: PKCS#1 v1.5 and Ed25519 are, and ECDSA uses
    /// RFC 6979's nonces (Go's are random; either verifies the same).
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, KeyError> {
        match self {
            PrivateKey::Rsa(key) => {
                let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key.as_ref().clone());
                signer
                    .try_sign(message)
                    .map(|s| s.to_vec())
                    .map_err(|e| e.to_string())
            }
            PrivateKey::EcdsaP256(key) => {
                let signer = p256::ecdsa::SigningKey::from(key);
                let signature: p256::ecdsa::Signature =
                    signer.try_sign(message).map_err(|e| e.to_string())?;
                Ok(signature.to_der().as_bytes().to_vec())
            }
            PrivateKey::Ed25519(key) => Ok(key.sign(message).to_bytes().to_vec()),
            PrivateKey::Dsa(_) => self.check_signer().map(|()| Vec::new()),
        }
    }

    /// Reads a private key from PEM as Sprig's `parsePrivateKeyPEM` does, with its
    /// messages.
    pub fn from_pem(text: &str) -> Result<PrivateKey, KeyError> {
        let block = pem::decode(text).ok_or("no PEM data in input")?;
        if block.label == "PRIVATE KEY" {
            return from_pkcs8(&block.der).map_err(|e| format!("decoding PEM as PKCS#8: {e}"));
        }
        let Some(kind) = block.label.strip_suffix(" PRIVATE KEY") else {
            return Err(format!(
                "no private key data in PEM block of type {}",
                block.label
            ));
        };
        match kind {
            "RSA" => RsaPrivateKey::from_pkcs1_der(&block.der)
                .map(|key| PrivateKey::Rsa(Box::new(key)))
                .map_err(|e| format!("parsing RSA private key from PEM: {e}")),
            "EC" => p256_from_sec1(&block.der)
                .map(PrivateKey::EcdsaP256)
                .map_err(|e| format!("parsing EC private key from PEM: {e}")),
            "DSA" => dsa_from_der(&block.der)
                .map(PrivateKey::Dsa)
                .map_err(|e| format!("parsing DSA private key from PEM: {e}")),
            _ => Err(format!("invalid private key type {}", block.label)),
        }
    }
}

fn from_pkcs8(der: &[u8]) -> Result<PrivateKey, KeyError> {
    let info = PrivateKeyInfo::try_from(der).map_err(|e| e.to_string())?;
    let algorithm = info.algorithm.oid.to_string();
    match algorithm.as_str() {
        "1.2.840.113549.1.1.1" => rsa::pkcs8::DecodePrivateKey::from_pkcs8_der(der)
            .map(|key| PrivateKey::Rsa(Box::new(key)))
            .map_err(|e| e.to_string()),
        "1.2.840.10045.2.1" => p256::pkcs8::DecodePrivateKey::from_pkcs8_der(der)
            .map(PrivateKey::EcdsaP256)
            .map_err(|e| format!("{e} (flotilla reads EC keys on the P-256 curve only)")),
        "1.3.101.112" => ed25519_dalek::SigningKey::from_pkcs8_der(der)
            .map(PrivateKey::Ed25519)
            .map_err(|e| e.to_string()),
        _ => Err(format!(
            "x509: PKCS#8 wrapping contained private key with unknown algorithm: {algorithm}"
        )),
    }
}

fn p256_from_sec1(der: &[u8]) -> Result<p256::SecretKey, KeyError> {
    p256::SecretKey::from_sec1_der(der)
        .map_err(|e| format!("{e} (flotilla reads EC keys on the P-256 curve only)"))
}

/// OpenSSL's DSA private key: a SEQUENCE of the version and five integers.
fn dsa_from_der(der: &[u8]) -> Result<DsaKey, KeyError> {
    use ::der::Decode as _;
    use ::der::asn1::UintRef;

    #[derive(::der::Sequence)]
    struct DsaKeyFormat<'a> {
        version: UintRef<'a>,
        p: UintRef<'a>,
        q: UintRef<'a>,
        g: UintRef<'a>,
        y: UintRef<'a>,
        x: UintRef<'a>,
    }

    // Go reads the version without checking it; so does this.
    let DsaKeyFormat {
        version: _,
        p,
        q,
        g,
        y,
        x,
    } = DsaKeyFormat::from_der(der).map_err(|e| e.to_string())?;
    let bytes = |n: UintRef<'_>| n.as_bytes().to_vec();
    Ok(DsaKey {
        p: bytes(p),
        q: bytes(q),
        g: bytes(g),
        y: bytes(y),
        x: bytes(x),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rsa_key_is_made_once_per_size_and_seed() {
        let first = rsa_key(512, [41; 32]).expect("a key");
        let again = rsa_key(512, [41; 32]).expect("a key");
        assert!(
            Arc::ptr_eq(&first, &again),
            "the kept key is handed out again"
        );
        let made = super::super::primes::generate(&mut ChaCha20Rng::from_seed([41; 32]), 512)
            .expect("a key");
        assert!(*first == made, "the kept key is the seed's");
        let other = rsa_key(512, [42; 32]).expect("a key");
        assert!(*other != *first);
        let larger = rsa_key(768, [41; 32]).expect("a key");
        assert_eq!(larger.size(), 96);
    }
}
