//! Random identifiers: pod sandbox and container IDs, exec session IDs.

/// A new pod sandbox or container ID: 32 random bytes as 64 lowercase hex
/// characters (as containerd's).
pub fn new_id() -> Result<String, getrandom::Error> {
    random_hex::<32>()
}

/// A new exec session ID (the monitor's session dir name): 12 random bytes
/// as 24 hex characters.
pub fn new_exec_id() -> Result<String, getrandom::Error> {
    random_hex::<12>()
}

/// Whether `s` looks like an ID [`new_id`] makes.
pub fn is_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn random_hex<const N: usize>() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_64_lowercase_hex_and_differ() {
        let a = new_id().unwrap();
        let b = new_id().unwrap();
        assert!(is_id(&a) && is_id(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(!is_id("abc"));
        assert!(!is_id(&"G".repeat(64)));
        assert!(!is_id(&"A".repeat(64)));
        let e = new_exec_id().unwrap();
        assert_eq!(e.len(), 24);
        assert!(e.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
