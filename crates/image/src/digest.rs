//! sha256 digests: the only algorithm the content store keys blobs by.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crust_quote::quote;

use crate::error::{Error, Result};

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:<hex>`; other algorithms are refused because blobs are
    /// stored (and verified) by sha256 only.
    pub fn parse(s: &str) -> Result<Self> {
        let Some((algo, hex)) = s.split_once(':') else {
            return Err(Error::InvalidArgument(format!(
                "digest {} has no algorithm prefix",
                quote(s)
            )));
        };
        if algo != "sha256" {
            return Err(Error::Unsupported(format!(
                "digest algorithm {} is not supported (only sha256)",
                quote(algo)
            )));
        }
        Self::from_hex(hex).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "digest {} is not 64 lowercase hex characters",
                quote(s)
            ))
        })
    }

    /// Accepts exactly 64 lowercase hex characters.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| Digest {
            hex: hex.to_string(),
        })
    }

    pub fn of(bytes: &[u8]) -> Self {
        Digest {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    pub(crate) fn from_hasher(hasher: Sha256) -> Self {
        Digest {
            hex: hex::encode(hasher.finalize()),
        }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The chain IDs of a layer stack: `chain[0] = diff[0]`,
/// `chain[n] = sha256(chain[n-1] + " " + diff[n])` (OCI image spec).
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    #[test]
    fn parses_sha256_only() {
        let d = Digest::parse(A).unwrap();
        assert_eq!(d.to_string(), A);
        assert!(Digest::parse("sha512:abcd").is_err());
        assert!(Digest::parse("2c26b46b").is_err());
        assert!(Digest::parse(&A.to_uppercase().replace("SHA256", "sha256")).is_err());
        assert!(Digest::parse("sha256:../../etc/passwd").is_err());
    }

    #[test]
    fn digest_of_bytes() {
        assert_eq!(Digest::of(b"foo").to_string(), A);
    }

    #[test]
    fn chain_ids_follow_the_spec() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of(format!("{a} {b}").as_bytes()));
        assert!(chain_ids(&[]).is_empty());
    }

    #[test]
    fn serde_round_trip_rejects_bad_digests() {
        let d = Digest::parse(A).unwrap();
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"sha256:zz\"").is_err());
    }
}
