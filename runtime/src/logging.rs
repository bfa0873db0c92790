//! The daemon's log: tracing to stderr, with a level that can change at
//! run time (`crust log-level debug --for 10m`, through the admin API) and
//! revert by itself, as Mesos' SET_LOGGING_LEVEL does with a duration.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::config::{Config, LogFormat, LogLevel};

/// The level in force and where it goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelState {
    pub level: LogLevel,
    pub configured: LogLevel,
    /// When `level` reverts to `configured`; None: it stays.
    pub until: Option<Instant>,
}

impl LevelState {
    /// Time left until the revert (None: no timer).
    pub fn left(&self, now: Instant) -> Option<Duration> {
        self.until.map(|t| t.saturating_duration_since(now))
    }
}

struct Inner {
    state: LevelState,
    /// Bumped by every change, so that an older change's timer does not
    /// undo a newer one.
    generation: u64,
}

/// Changes the daemon's log level at run time.
#[derive(Clone)]
pub struct LogControl {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    quiet: &'static str,
    inner: Arc<Mutex<Inner>>,
}

/// The filter of `level`: dependencies' chatter (`quiet`, directives
/// such as `hyper=warn`) stays down unless tracing everything.
fn filter(level: LogLevel, quiet: &str) -> EnvFilter {
    let level_text = level.as_str();
    if level == LogLevel::Trace || quiet.is_empty() {
        EnvFilter::new(level_text)
    } else {
        EnvFilter::new(format!("{level_text},{quiet}"))
    }
}

/// Sets up the daemon's log (once per process) and answers its control.
/// `quiet`: directives for dependencies below trace (see [`filter`]).
pub fn init(config: &Config, quiet: &'static str) -> LogControl {
    let (filter_layer, handle) = reload::Layer::new(filter(config.log_level, quiet));
    let ansi = std::io::stderr().is_terminal();
    let (text, json) = match config.log_format {
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            ),
        ),
    };
    tracing_subscriber::registry()
        .with(filter_layer)
        .with(text)
        .with(json)
        .init();
    LogControl {
        handle: Some(handle),
        quiet,
        inner: Arc::new(Mutex::new(Inner {
            state: LevelState {
                level: config.log_level,
                configured: config.log_level,
                until: None,
            },
            generation: 0,
        })),
    }
}

impl LogControl {
    /// A control that changes nothing but its own state (unit tests).
    #[cfg(test)]
    pub fn detached(level: LogLevel) -> LogControl {
        LogControl {
            handle: None,
            quiet: "",
            inner: Arc::new(Mutex::new(Inner {
                state: LevelState {
                    level,
                    configured: level,
                    until: None,
                },
                generation: 0,
            })),
        }
    }

    pub fn state(&self) -> LevelState {
        self.lock().state
    }

    /// Puts `level` in force; after `duration` (if any) the configured
    /// level comes back, unless another change came first. Must run on
    /// the daemon's async runtime (the revert is a task).
    pub fn set(&self, level: LogLevel, duration: Option<Duration>) -> Result<LevelState, String> {
        let (state, generation) = {
            let mut inner = self.lock();
            self.apply(level)?;
            inner.generation += 1;
            inner.state.level = level;
            inner.state.until = duration.map(|d| Instant::now() + d);
            (inner.state, inner.generation)
        };
        // Said at warn, so that it shows whatever the level.
        warn!(
            level = level.as_str(),
            for_seconds = duration.map(|d| d.as_secs()),
            "log level changed"
        );
        if let Some(d) = duration {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                this.revert(generation);
            });
        }
        Ok(state)
    }

    /// Back to the configured level, if no change came after `generation`.
    fn revert(&self, generation: u64) {
        let configured = {
            let mut inner = self.lock();
            if inner.generation != generation {
                return;
            }
            let configured = inner.state.configured;
            if let Err(e) = self.apply(configured) {
                warn!("cannot revert the log level: {e}");
                return;
            }
            inner.state.level = configured;
            inner.state.until = None;
            configured
        };
        info!(
            level = configured.as_str(),
            "log level reverted to the configured one"
        );
    }

    fn apply(&self, level: LogLevel) -> Result<(), String> {
        match &self.handle {
            Some(h) => h
                .reload(filter(level, self.quiet))
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A duration as operators write it: `90s`, `10m`, `1h30m`, `2h`, or a
/// bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => {
                return Err(format!("invalid duration {t:?}: use e.g. 30s, 10m, 1h30m"));
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("invalid duration {t:?}: a number must come before {c:?}"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {t:?} is too long"))?;
    }
    if !digits.is_empty() {
        return Err(format!(
            "invalid duration {t:?}: a unit (s, m, h, d) must follow {digits}"
        ));
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        for bad in ["", "m", "10x", "1h30", "-5s", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_level_reverts_unless_changed_again() {
        let c = LogControl::detached(LogLevel::Info);
        let s = c
            .set(LogLevel::Debug, Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(s.level, LogLevel::Debug);
        let left = s.left(Instant::now()).unwrap();
        assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(29));
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(c.state().level, LogLevel::Info);
        assert_eq!(c.state().until, None);

        // A newer change outlives the older one's timer.
        c.set(LogLevel::Debug, Some(Duration::from_secs(10)))
            .unwrap();
        c.set(LogLevel::Trace, None).unwrap();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(c.state().level, LogLevel::Trace);
    }
}
