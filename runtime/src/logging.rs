//! The daemon's log: tracing to stderr, with a level that can change at
//! run time (`crust log-level debug --for 10m`, through the admin API) and
//! revert by itself, as Mesos' SET_LOGGING_LEVEL does with a duration; a
//! config reload changes the configured level and the format. With
//! `[tracing] endpoint` set, the OTel layer sits beside the log's layers:
//! it sees only the spans of `otel::TARGET`, and the log lines written in
//! a CRI call carry its span's `trace_id` field.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber, info, warn};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::config::{Config, LogFormat, LogLevel};
use crate::otel::{self, OtelError};

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

/// Changes the daemon's log level and format at run time.
#[derive(Clone)]
pub struct LogControl {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    quiet: &'static str,
    /// The directive of the OTel spans' target: on with tracing, else off
    /// (at any level: without tracing they are never made).
    spans: Arc<str>,
    /// The exporting side when tracing is on; flushed at shutdown.
    tracing: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    inner: Arc<Mutex<Inner>>,
    /// Events are written as JSON (else as text).
    json: Arc<AtomicBool>,
}

/// Both formats' layers see every span (each keeps its own rendering of
/// the span's fields, which its events need); each event goes to the one
/// in force. So the format can change while spans are open.
struct FormatSwitch<T, J> {
    text: T,
    json: J,
    json_on: Arc<AtomicBool>,
}

impl<S, T, J> Layer<S> for FormatSwitch<T, J>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    T: Layer<S>,
    J: Layer<S>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.text.on_new_span(attrs, id, ctx.clone());
        self.json.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.text.on_record(span, values, ctx.clone());
        self.json.on_record(span, values, ctx);
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.text.on_follows_from(span, follows, ctx.clone());
        self.json.on_follows_from(span, follows, ctx);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.text.on_enter(id, ctx.clone());
        self.json.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.text.on_exit(id, ctx.clone());
        self.json.on_exit(id, ctx);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.text.on_close(id.clone(), ctx.clone());
        self.json.on_close(id, ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if self.json_on.load(Ordering::Relaxed) {
            self.json.on_event(event, ctx);
        } else {
            self.text.on_event(event, ctx);
        }
    }
}

/// The filter of `level`: dependencies' chatter (`quiet`, directives
/// such as `hyper=warn`) stays down unless tracing everything; `spans`
/// turns the OTel spans' target on or off whatever the level.
fn filter(level: LogLevel, quiet: &str, spans: &str) -> EnvFilter {
    let level_text = level.as_str();
    if level == LogLevel::Trace || quiet.is_empty() {
        EnvFilter::new(format!("{level_text},{spans}"))
    } else {
        EnvFilter::new(format!("{level_text},{quiet},{spans}"))
    }
}

/// The directive of [`otel::TARGET`].
fn spans_directive(on: bool) -> Arc<str> {
    let level = if on { "trace" } else { "off" };
    format!("{}={level}", otel::TARGET).into()
}

/// Sets up the daemon's log (once per process) and answers its control.
/// `quiet`: directives for dependencies below trace (see [`filter`]).
/// With `[tracing] endpoint` set, also the OTel layer and its exporter:
/// call it inside the daemon's tokio runtime then.
pub fn init(config: &Config, quiet: &'static str) -> Result<LogControl, OtelError> {
    let pipeline = otel::pipeline(&config.tracing)?;
    let spans = spans_directive(pipeline.is_some());
    let (filter_layer, handle) = reload::Layer::new(filter(config.log_level, quiet, &spans));
    let ansi = std::io::stderr().is_terminal();
    let json = Arc::new(AtomicBool::new(config.log_format == LogFormat::Json));
    let formats = FormatSwitch {
        text: tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr),
        json: tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr),
        json_on: json.clone(),
    };
    let (otel_layer, provider) = match pipeline {
        Some(p) => {
            let layer = tracing_opentelemetry::layer()
                .with_tracer(p.tracer)
                // What a span costs: no code locations, thread names,
                // busy/idle timings or context activation, which nothing
                // here reads.
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_context_activation(false)
                // Only crust's own spans (and their events), not every
                // log line as a span event.
                .with_filter(Targets::new().with_target(otel::TARGET, tracing::Level::TRACE));
            (Some(layer), Some(p.provider))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter_layer)
        .with(formats)
        .with(otel_layer)
        .init();
    if provider.is_some() {
        info!(
            endpoint = %config.tracing.endpoint.trim(),
            sampling_rate_per_million = config.tracing.sampling_rate_per_million,
            service_name = %config.tracing.service_name.trim(),
            "OpenTelemetry tracing on (OTLP/gRPC)"
        );
    }
    Ok(LogControl {
        handle: Some(handle),
        quiet,
        spans,
        tracing: provider,
        inner: Arc::new(Mutex::new(Inner {
            state: LevelState {
                level: config.log_level,
                configured: config.log_level,
                until: None,
            },
            generation: 0,
        })),
        json,
    })
}

impl LogControl {
    /// A control that changes nothing but its own state (unit tests).
    #[cfg(test)]
    pub fn detached(level: LogLevel) -> LogControl {
        LogControl {
            handle: None,
            quiet: "",
            spans: spans_directive(false),
            tracing: None,
            inner: Arc::new(Mutex::new(Inner {
                state: LevelState {
                    level,
                    configured: level,
                    until: None,
                },
                generation: 0,
            })),
            json: Arc::new(AtomicBool::new(false)),
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

    /// A new configured level (a config reload). It is put in force at
    /// once, unless a timed change (`crust log-level LEVEL --for D`) is in
    /// force: that one ends as planned, at the new configured level.
    pub fn set_configured(&self, configured: LogLevel) -> Result<LevelState, String> {
        let state = {
            let mut inner = self.lock();
            if inner.state.until.is_none() {
                self.apply(configured)?;
                inner.state.level = configured;
                // An untimed change's (none pending) is replaced.
                inner.generation += 1;
            }
            inner.state.configured = configured;
            inner.state
        };
        warn!(
            level = state.level.as_str(),
            configured = configured.as_str(),
            "log level configured (config reload)"
        );
        Ok(state)
    }

    /// Events are written in `format` from now on.
    pub fn set_format(&self, format: LogFormat) {
        self.json
            .store(format == LogFormat::Json, Ordering::Relaxed);
        warn!(format = ?format, "log format changed (config reload)");
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
                .reload(filter(level, self.quiet, &self.spans))
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Exports the spans still queued (at shutdown), waiting at most for
    /// the exporter's timeout. Blocks: call it off the async workers.
    pub fn flush_traces(&self) {
        if let Some(p) = &self.tracing
            && let Err(e) = p.shutdown()
        {
            warn!("exporting the last spans: {e}");
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

    #[tokio::test(start_paused = true)]
    async fn a_reload_sets_the_configured_level_after_a_timed_change() {
        let c = LogControl::detached(LogLevel::Info);
        let s = c.set_configured(LogLevel::Warn).unwrap();
        assert_eq!((s.level, s.configured), (LogLevel::Warn, LogLevel::Warn));

        // A timed change runs its course, then the new configured level.
        c.set(LogLevel::Debug, Some(Duration::from_secs(30)))
            .unwrap();
        let s = c.set_configured(LogLevel::Error).unwrap();
        assert_eq!((s.level, s.configured), (LogLevel::Debug, LogLevel::Error));
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(c.state().level, LogLevel::Error);

        // An untimed change gives way to the reload.
        c.set(LogLevel::Trace, None).unwrap();
        let s = c.set_configured(LogLevel::Info).unwrap();
        assert_eq!((s.level, s.configured), (LogLevel::Info, LogLevel::Info));
    }
}
