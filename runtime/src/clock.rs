//! Wall-clock time as CRI carries it.

/// Nanoseconds since the Unix epoch (0 before it, saturating far after it).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
