//! What the property tests of every hostile-input parser share: case
//! counts, strategies for hostile strings, and the check that an error
//! message stays short whatever the input was.
//!
//! Case counts are chosen per test so the whole property suite fits CI's
//! budget; `PROPTEST_CASES=N` overrides every one of them for a longer run
//! by hand (see DEVELOPERS.md).

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// The longest error message any parser may produce: fixed text, field
/// names and a few quotes of at most [`crate::MAX_QUOTED`] bytes each,
/// whatever the size of the input.
pub const MAX_MESSAGE: usize = 1024;

/// `default` cases, or `PROPTEST_CASES` when set.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A proptest config with [`cases`]`(default)` cases, failures persisted
/// next to the test source (`<file>.proptest-regressions`, committed), and
/// shrinking bounded so a failure is reported in seconds.
pub fn config(default: u32) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

/// Fails the case when `msg` is longer than [`MAX_MESSAGE`].
pub fn check_message(what: &str, msg: &str) -> Result<(), TestCaseError> {
    if msg.len() > MAX_MESSAGE {
        return Err(TestCaseError::fail(format!(
            "{what}: error message of {} bytes (limit {MAX_MESSAGE}): {}...",
            msg.len(),
            crate::clip(msg)
        )));
    }
    Ok(())
}

/// One char repeated 257..=8192 times: over the quote limit, so an error
/// that quotes it whole fails [`check_message`].
pub fn long_string() -> BoxedStrategy<String> {
    (
        prop_oneof![
            Just('a'),
            Just('/'),
            Just('.'),
            Just('\0'),
            Just('"'),
            Just('\n'),
            Just('é'),
            any::<char>()
        ],
        257usize..8192,
    )
        .prop_map(|(c, n)| c.to_string().repeat(n))
        .boxed()
}

/// Strings a hostile peer would send: plausible tokens, path tricks,
/// control characters, arbitrary Unicode and over-long values.
///
/// Strategies are boxed: the value trees of deeply composed unboxed
/// strategies are large enough, in a debug build, to overflow a test
/// thread's 2 MiB stack.
pub fn hostile_string() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "[a-z0-9._:/@+-]{0,24}",
        1 => prop_oneof![
            Just(String::new()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("/".to_string()),
            Just("../../../../etc/passwd".to_string()),
            Just("/etc/shadow".to_string()),
            Just("a\0b".to_string()),
            Just("a\nb".to_string()),
            Just(" ".to_string()),
            Just("-1".to_string()),
            Just("18446744073709551616".to_string()),
        ],
        1 => any::<String>(),
        1 => long_string(),
    ]
    .boxed()
}
