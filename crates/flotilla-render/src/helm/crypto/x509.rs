//! X.509 certificates as Sprig's template and Go's `x509.CreateCertificate` make them:
//! version 3, a 128-bit serial, the subject's common name only, and these extensions in
//! Go's order: key usage (critical; digital signature and key encipherment, plus
//! certificate signing for a CA), extended key usage (server and client
//! authentication), basic constraints (critical), the subject key identifier of a CA
//! (SHA-256 of the public key cut to 20 bytes, as Go 1.25 makes it), the authority key
//! identifier of a certificate signed by another, and the subject alternative names
//! (critical when the subject is empty).

use std::net::IpAddr;

use der::Decode as _;
use der::Encode as _;
use der::asn1::{ObjectIdentifier, OctetString};
use sha2::Digest as _;

use super::der::{
    TAG_BOOLEAN, TAG_OID, TAG_PRINTABLE_STRING, TAG_SET, TAG_UTF8_STRING, bit_string, constructed,
    is_printable, octet_string, sequence, time, tlv, unsigned_integer,
};
use super::keys::{KeyError, PrivateKey};

const OID_COMMON_NAME: &[u8] = &[TAG_OID, 3, 0x55, 0x04, 0x03];
const OID_KEY_USAGE: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x0f];
const OID_EXT_KEY_USAGE: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x25];
const OID_BASIC_CONSTRAINTS: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x13];
const OID_SUBJECT_KEY_ID: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x0e];
const OID_AUTHORITY_KEY_ID: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x23];
const OID_SUBJECT_ALT_NAME: &[u8] = &[TAG_OID, 3, 0x55, 0x1d, 0x11];
const SUBJECT_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.14");

/// Key usage bit strings as Go writes them: digital signature and key encipherment
/// (bits 0 and 2), and for a CA certificate signing too (bit 5).
const KEY_USAGE_LEAF: &[u8] = &[0x03, 0x02, 0x05, 0xa0];
const KEY_USAGE_CA: &[u8] = &[0x03, 0x02, 0x02, 0xa4];
/// TLS server and client authentication.
const EXT_KEY_USAGE: &[u8] = &[
    0x30, 0x14, 0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01, 0x06, 0x08, 0x2b, 0x06,
    0x01, 0x05, 0x05, 0x07, 0x03, 0x02,
];
const BASIC_CONSTRAINTS_LEAF: &[u8] = &[0x30, 0x00];
const BASIC_CONSTRAINTS_CA: &[u8] = &[0x30, 0x03, 0x01, 0x01, 0xff];

/// What Sprig's `getBaseCertTemplate` fills in, and whether the certificate is a CA.
pub struct CertificateTemplate<'a> {
    pub common_name: &'a str,
    pub ips: &'a [IpAddr],
    pub dns_names: &'a [String],
    pub not_before: i64,
    pub not_after: i64,
    pub is_ca: bool,
    /// Big-endian; Sprig's serial is uniform below 2^128.
    pub serial: [u8; 16],
}

/// The parts of a signing CA's certificate a new certificate takes from it.
pub struct Parent {
    subject: Vec<u8>,
    subject_key_id: Option<Vec<u8>>,
    public_key_bits: Vec<u8>,
}

impl Parent {
    /// Reads a certificate's DER (Go's `x509.ParseCertificate`, error text aside).
    pub fn from_der(der: &[u8]) -> Result<Parent, KeyError> {
        let certificate = x509_cert::Certificate::from_der(der).map_err(|e| e.to_string())?;
        let tbs = certificate.tbs_certificate;
        let subject = tbs.subject.to_der().map_err(|e| e.to_string())?;
        let subject_key_id = tbs
            .extensions
            .iter()
            .flatten()
            .find(|extension| extension.extn_id == SUBJECT_KEY_ID)
            .map(|extension| {
                OctetString::from_der(extension.extn_value.as_bytes())
                    .map(|id| id.as_bytes().to_vec())
                    .map_err(|e| format!("x509: invalid subject key identifier: {e}"))
            })
            .transpose()?;
        Ok(Parent {
            subject,
            subject_key_id,
            public_key_bits: tbs
                .subject_public_key_info
                .subject_public_key
                .raw_bytes()
                .to_vec(),
        })
    }
}

/// Makes a certificate's DER for `subject_key`, self-signed when `issuer` is `None`,
/// with Go's checks in Go's order and its messages.
pub fn create_certificate(
    template: &CertificateTemplate<'_>,
    subject_key: &PrivateKey,
    issuer: Option<(&Parent, &PrivateKey)>,
) -> Result<Vec<u8>, KeyError> {
    let signer = issuer.map_or(subject_key, |(_, key)| key);
    let signature_algorithm = signer.signature_algorithm()?;
    let (public_key_info, public_key_bits) = subject_key.public_key_info()?;

    let subject = name(template.common_name);
    let issuer_name = issuer.map_or(&subject, |(parent, _)| &parent.subject);
    // Go takes the authority key identifier from the parent, unless the certificate
    // is self-issued (same subject and issuer bytes).
    let authority_key_id = issuer
        .filter(|_| *issuer_name != subject)
        .and_then(|(parent, _)| parent.subject_key_id.as_deref())
        .filter(|id| !id.is_empty());
    let subject_key_id = template
        .is_ca
        .then(|| sha2::Sha256::digest(&public_key_bits)[..20].to_vec());

    if let Some((parent, key)) = issuer {
        let (_, signer_bits) = key.public_key_info()?;
        if signer_bits != parent.public_key_bits {
            return Err("x509: provided PrivateKey doesn't match parent's PublicKey".to_string());
        }
    }

    let mut extensions = vec![
        extension(
            OID_KEY_USAGE,
            true,
            if template.is_ca {
                KEY_USAGE_CA
            } else {
                KEY_USAGE_LEAF
            },
        ),
        extension(OID_EXT_KEY_USAGE, false, EXT_KEY_USAGE),
        extension(
            OID_BASIC_CONSTRAINTS,
            true,
            if template.is_ca {
                BASIC_CONSTRAINTS_CA
            } else {
                BASIC_CONSTRAINTS_LEAF
            },
        ),
    ];
    if let Some(id) = &subject_key_id {
        extensions.push(extension(OID_SUBJECT_KEY_ID, false, &octet_string(id)));
    }
    if let Some(id) = authority_key_id {
        extensions.push(extension(
            OID_AUTHORITY_KEY_ID,
            false,
            &sequence(&[&tlv(0x80, id)]),
        ));
    }
    if !template.dns_names.is_empty() || !template.ips.is_empty() {
        let names = alternative_names(template.dns_names, template.ips)?;
        let subject_is_empty = subject == sequence(&[]);
        extensions.push(extension(OID_SUBJECT_ALT_NAME, subject_is_empty, &names));
    }

    let validity_error = || "x509: the validity period cannot be written as an ASN.1 time";
    let not_before = time(template.not_before).ok_or_else(validity_error)?;
    let not_after = time(template.not_after).ok_or_else(validity_error)?;
    let extension_refs: Vec<&[u8]> = extensions.iter().map(Vec::as_slice).collect();
    let tbs = sequence(&[
        &constructed(0xa0, &[&unsigned_integer(&[2])]),
        &unsigned_integer(&template.serial),
        &signature_algorithm,
        issuer_name,
        &sequence(&[&not_before, &not_after]),
        &subject,
        &public_key_info,
        &constructed(0xa3, &[&sequence(&extension_refs)]),
    ]);
    let signature = signer.sign(&tbs)?;
    Ok(sequence(&[
        &tbs,
        &signature_algorithm,
        &bit_string(&signature),
    ]))
}

/// The subject (or issuer) with only a common name, as Go writes `pkix.Name`; an
/// empty name is an empty sequence.
fn name(common_name: &str) -> Vec<u8> {
    if common_name.is_empty() {
        return sequence(&[]);
    }
    let tag = if is_printable(common_name) {
        TAG_PRINTABLE_STRING
    } else {
        TAG_UTF8_STRING
    };
    let attribute = sequence(&[OID_COMMON_NAME, &tlv(tag, common_name.as_bytes())]);
    sequence(&[&constructed(TAG_SET, &[&attribute])])
}

fn extension(id: &[u8], critical: bool, value: &[u8]) -> Vec<u8> {
    let critical_flag = tlv(TAG_BOOLEAN, &[0xff]);
    let flag: &[u8] = if critical { &critical_flag } else { &[] };
    sequence(&[id, flag, &octet_string(value)])
}

/// GeneralNames as Go orders them: DNS names, then IP addresses (IPv4, and IPv4
/// mapped into IPv6, in 4 bytes).
fn alternative_names(dns_names: &[String], ips: &[IpAddr]) -> Result<Vec<u8>, KeyError> {
    let mut names = Vec::new();
    for dns in dns_names {
        if !dns.is_ascii() {
            return Err(format!("x509: {dns:?} cannot be encoded as an IA5String"));
        }
        names.extend(tlv(0x82, dns.as_bytes()));
    }
    for ip in ips {
        let octets = match ip {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.octets().to_vec(),
                None => v6.octets().to_vec(),
            },
        };
        names.extend(tlv(0x87, &octets));
    }
    Ok(tlv(0x30, &names))
}
