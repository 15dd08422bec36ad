//! RSA keys generated exactly as the `rsa` crate's `RsaPrivateKey::new` generates
//! them from the same random source (the same candidates drawn in the same order, so
//! the same key for the same seed), only with less work per candidate.
//!
//! The crate draws a random odd number with its top two bits set, moves it to the
//! nearest number with no factor up to 53, and asks `probably_prime(p, 20)`: 20
//! Miller-Rabin rounds with random bases, one with base 2, then a Lucas test. A
//! random candidate of 1,024 or 2,048 bits is almost never prime, and nearly all of
//! the time went into the first Miller-Rabin round of candidates that are not. Here
//! each candidate is first divided by the primes from 59 to 16,381 (a candidate with
//! such a factor is not prime, and the crate would refuse it too), then put through
//! one Miller-Rabin round with base 2 (a candidate that fails it is not prime, and
//! the crate, which also tries base 2, would refuse it). Only a candidate that passes
//! both, in practice a prime, is handed to the crate's own `probably_prime`, whose
//! answer decides as it does in `RsaPrivateKey::new`. So the keys are the crate's;
//! a test compares them on many seeds.

use std::sync::OnceLock;

use num_bigint_dig::prime::probably_prime;
use num_bigint_dig::{BigUint, ModInverse as _};
use rand_core::RngCore;
use rsa::RsaPrivateKey;

/// The public exponent of every key (the crate's default).
const EXPONENT: u32 = 65537;

/// The primes the crate's candidate search avoids as factors, and their product.
const SEARCH_PRIMES: [u8; 15] = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53];
const SEARCH_PRIMES_PRODUCT: u64 = 16_294_579_238_595_022_365;

/// Candidates are also divided by every prime above 53 and below this bound.
const TRIAL_BOUND: usize = 16_384;

/// The Miller-Rabin rounds the crate's `probably_prime` runs (and one more with base 2).
const ROUNDS: usize = 20;

/// A key of `bits` bits with two primes and the exponent 65,537, drawn from `rng`:
/// what `RsaPrivateKey::new(rng, bits)` returns for a source in the same state.
pub fn generate(rng: &mut dyn RngCore, bits: usize) -> rsa::Result<RsaPrivateKey> {
    if bits < 64 {
        // Too small for the search below to be the crate's (it counts the primes
        // first); such keys are never asked for.
        return Err(rsa::Error::TooFewPrimes);
    }
    let exponent = BigUint::from(EXPONENT);
    loop {
        let p = prime(rng, bits / 2);
        let q = prime(rng, bits - p.bits());
        if p == q {
            continue;
        }
        let n = &p * &q;
        if n.bits() != bits {
            continue;
        }
        let one = BigUint::from(1u32);
        let totient = (&p - &one) * (&q - &one);
        let Some(d) = (&exponent).mod_inverse(totient) else {
            continue;
        };
        let d = d.to_biguint().ok_or(rsa::Error::InvalidPrime)?;
        return RsaPrivateKey::from_components(n, exponent, d, vec![p, q]);
    }
}

/// The crate's `gen_prime`: a prime of exactly `bits` bits (at least 7), from
/// candidates drawn from `rng` as the crate draws them.
fn prime(rng: &mut dyn RngCore, bits: usize) -> BigUint {
    let top = match bits % 8 {
        0 => 8,
        b => b,
    };
    let mut bytes = vec![0u8; bits.div_ceil(8)];
    let last = bytes.len() - 1;
    loop {
        rng.fill_bytes(&mut bytes);
        // At most `bits` bits, the top two set, odd.
        bytes[0] &= ((1u32 << top) - 1) as u8;
        if top >= 2 {
            bytes[0] |= 3u8 << (top - 2);
        } else {
            bytes[0] |= 1;
            if last > 0 {
                bytes[1] |= 0x80;
            }
        }
        bytes[last] |= 1;
        let mut candidate = BigUint::from_bytes_be(&bytes);
        // The nearest number above with no factor up to 53 (within 2^20).
        let rem = remainder(&limbs(&candidate), SEARCH_PRIMES_PRODUCT);
        let delta = (0..1u64 << 20).step_by(2).find(|delta| {
            SEARCH_PRIMES
                .iter()
                .all(|&p| !(rem + delta).is_multiple_of(u64::from(p)))
        });
        if let Some(delta) = delta.filter(|&d| d > 0) {
            candidate += BigUint::from(delta);
        }
        if candidate.bits() == bits && is_prime(&candidate) {
            return candidate;
        }
    }
}

/// The crate's `probably_prime(n, 20)` for an odd `n` above 2^64, deciding the same:
/// false at once for a factor below [`TRIAL_BOUND`] or a failed round with base 2.
fn is_prime(n: &BigUint) -> bool {
    let limbs = limbs(n);
    let factor = trial_groups().iter().any(|(product, primes)| {
        let rem = remainder(&limbs, *product);
        primes.iter().any(|&p| rem.is_multiple_of(u64::from(p)))
    });
    !factor && strong_probable_prime_base_2(n) && probably_prime(n, ROUNDS)
}

/// `n`'s 64-bit limbs, least significant first.
fn limbs(n: &BigUint) -> Vec<u64> {
    n.to_bytes_le()
        .chunks(8)
        .map(|chunk| {
            let mut limb = [0u8; 8];
            limb[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(limb)
        })
        .collect()
}

/// `n mod m` for `n` as 64-bit limbs, least significant first.
fn remainder(limbs: &[u64], m: u64) -> u64 {
    let m = u128::from(m);
    let rem = limbs
        .iter()
        .rev()
        .fold(0u128, |rem, &limb| ((rem << 64) | u128::from(limb)) % m);
    rem as u64
}

/// The primes above 53 and below [`TRIAL_BOUND`], in groups whose product fits a
/// u64 (one remainder of the candidate per group, then one per prime of a u64).
fn trial_groups() -> &'static [(u64, Vec<u32>)] {
    static GROUPS: OnceLock<Vec<(u64, Vec<u32>)>> = OnceLock::new();
    GROUPS.get_or_init(|| {
        let mut composite = vec![false; TRIAL_BOUND];
        let mut groups: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut group = (1u64, Vec::new());
        for i in 2..TRIAL_BOUND {
            if composite[i] {
                continue;
            }
            for multiple in (i * i..TRIAL_BOUND).step_by(i) {
                composite[multiple] = true;
            }
            if i <= 53 {
                continue;
            }
            let p = u32::try_from(i).expect("below the bound");
            match group.0.checked_mul(u64::from(p)) {
                Some(product) => {
                    group.0 = product;
                    group.1.push(p);
                }
                None => groups.push(std::mem::replace(&mut group, (u64::from(p), vec![p]))),
            }
        }
        groups.push(group);
        groups
    })
}

/// One Miller-Rabin round with base 2: false means `n` (odd, above 2) is composite.
fn strong_probable_prime_base_2(n: &BigUint) -> bool {
    let one = BigUint::from(1u32);
    let n_minus_1 = n - &one;
    let twos = n_minus_1.trailing_zeros().unwrap_or(0);
    let odd = &n_minus_1 >> twos;
    let mut y = BigUint::from(2u32).modpow(&odd, n);
    if y == one || y == n_minus_1 {
        return true;
    }
    for _ in 1..twos {
        y = (&y * &y) % n;
        if y == n_minus_1 {
            return true;
        }
        if y == one {
            return false;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng as _;

    use super::*;

    /// The keys are the crate's: the same seed gives the same key (sizes small
    /// enough for an unoptimised build; the search is the same at every size).
    #[test]
    fn keys_are_those_the_rsa_crate_makes_from_the_same_seed() {
        for (seed, bits) in (0u8..12).zip([512, 768, 1024].into_iter().cycle()) {
            let ours = generate(&mut ChaCha20Rng::from_seed([seed; 32]), bits).expect("a key");
            let theirs =
                RsaPrivateKey::new(&mut ChaCha20Rng::from_seed([seed; 32]), bits).expect("a key");
            assert!(ours == theirs, "seed {seed}, {bits} bits: another key");
        }
    }

    #[test]
    fn primes_are_of_the_size_asked_and_prime() {
        let mut rng = ChaCha20Rng::from_seed([7; 32]);
        for bits in [64, 65, 127, 256] {
            let p = prime(&mut rng, bits);
            assert_eq!(p.bits(), bits);
            assert!(probably_prime(&p, ROUNDS), "{p} is not prime");
        }
    }

    #[test]
    fn composites_are_refused_before_the_crates_test() {
        // A product of two primes above the trial bound fails the base-2 round; a
        // multiple of 16,381 fails the trial division.
        let p = prime(&mut ChaCha20Rng::from_seed([1; 32]), 96);
        let q = prime(&mut ChaCha20Rng::from_seed([2; 32]), 96);
        let n = &p * &q;
        assert!(!strong_probable_prime_base_2(&n));
        assert!(!is_prime(&n));
        assert!(!is_prime(&(&p * BigUint::from(16_381u32))));
        assert!(is_prime(&p));
        // The groups cover every prime from 59 to the bound once.
        let primes: Vec<u32> = trial_groups().iter().flat_map(|(_, p)| p.clone()).collect();
        assert_eq!(primes.first(), Some(&59));
        assert_eq!(primes.last(), Some(&16_381));
        assert!(primes.windows(2).all(|w| w[0] < w[1]));
        for (product, members) in trial_groups() {
            let expected = members.iter().map(|&p| u64::from(p)).product::<u64>();
            assert_eq!(*product, expected);
        }
        // The remainder of a many-limb number agrees with the crate's.
        let limbs = limbs(&n);
        for m in [59u64, 16_381, 18_446_744_073_709_551_557] {
            let expected = super::limbs(&(&n % BigUint::from(m)));
            assert_eq!(vec![remainder(&limbs, m)], expected);
        }
    }
}
