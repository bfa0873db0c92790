//! The daemon's own process figures under their standard Prometheus names
//! (`process_*`), read from /proc/self at scrape time: one read of
//! `/proc/self/stat` and one listing of `/proc/self/fd`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub struct ProcessCollector {
    page_size: u64,
    ticks_per_second: f64,
    /// Seconds since the Unix epoch (fixed, so read once).
    start_time: Option<f64>,
}

/// The fields of /proc/self/stat this reports.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    utime_ticks: u64,
    stime_ticks: u64,
    threads: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        use nix::unistd::{SysconfVar, sysconf};
        let page_size = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        let ticks_per_second = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        let start_time = read_stat().and_then(|stat| {
            let boot = boot_time()?;
            Some(boot + stat.start_ticks as f64 / ticks_per_second)
        });
        ProcessCollector {
            page_size,
            ticks_per_second,
            start_time,
        }
    }
}

fn read_stat() -> Option<Stat> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Fields after the command (which may hold spaces and parentheses), as
/// proc(5) numbers them from 3.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = text.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
    Some(Stat {
        utime_ticks: n(14)?,
        stime_ticks: n(15)?,
        threads: n(20)?,
        start_ticks: n(22)?,
        vsize: n(23)?,
        rss_pages: n(24)?,
    })
}

/// The boot time (seconds since the epoch), `btime` of /proc/stat.
fn boot_time() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn max_fds() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = |encoder: &mut DescriptorEncoder, name, help, v: i64| {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        if let Some(stat) = read_stat() {
            let cpu = ConstCounter::new(
                (stat.utime_ticks + stat.stime_ticks) as f64 / self.ticks_per_second,
            );
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                (stat.rss_pages * self.page_size) as i64,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.vsize as i64,
            )?;
            gauge(
                &mut encoder,
                "process_threads",
                "OS threads of the process",
                stat.threads as i64,
            )?;
        }
        if let Some(n) = open_fds() {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors",
                n as i64,
            )?;
        }
        if let Some(n) = max_fds() {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors (soft limit)",
                n as i64,
            )?;
        }
        if let Some(t) = self.start_time {
            let g = ConstGauge::new(t);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parens() {
        let text = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 \
                    7 3 0 0 20 0 5 0 1234 10485760 300 18446744073709551615 \
                    1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(
            parse_stat(text).unwrap(),
            Stat {
                utime_ticks: 7,
                stime_ticks: 3,
                threads: 5,
                start_ticks: 1234,
                vsize: 10485760,
                rss_pages: 300,
            }
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_figures_are_plausible() {
        let stat = read_stat().unwrap();
        assert!(stat.threads >= 1 && stat.rss_pages > 0, "{stat:?}");
        assert!(open_fds().unwrap() >= 3);
        let c = ProcessCollector::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = c.start_time.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
    }
}
