//! Latency summaries, footprint figures, the report and its table.

use std::time::Duration;

use serde::Serialize;

/// One latency figure (a scenario phase) on one endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub scenario: String,
    pub endpoint: String,
    pub iterations: usize,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// A single measured value (memory in KiB, throughput in MB/s, wall time in
/// ms) on one endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub endpoint: String,
    pub value: f64,
    pub unit: &'static str,
}

/// A/B of one figure; `None` where B has no such figure (n/a there).
#[derive(Debug, Serialize)]
pub struct Ratio {
    pub name: String,
    pub median_a_over_b: Option<f64>,
    pub p99_a_over_b: Option<f64>,
}

/// A scenario that does not apply to an endpoint (e.g. a runtime handler it
/// does not have): shown as n/a instead of failing the run.
#[derive(Debug, Clone, Serialize)]
pub struct NotApplicable {
    /// The figure-name prefix, e.g. `ctr[embedded]`.
    pub name: String,
    pub endpoint: String,
    pub reason: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub results: Vec<Summary>,
    pub figures: Vec<Figure>,
    pub ratios: Vec<Ratio>,
    pub not_applicable: Vec<NotApplicable>,
    pub skipped: Vec<String>,
    /// What was measured where (e.g. which process is the monitor).
    pub notes: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e6
}

pub fn summarize(scenario: &str, endpoint: &str, mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    Summary {
        scenario: scenario.to_string(),
        endpoint: endpoint.to_string(),
        iterations: samples.len(),
        median_us: percentile(&samples, 0.5),
        p90_us: percentile(&samples, 0.9),
        p99_us: percentile(&samples, 0.99),
        max_us: percentile(&samples, 1.0),
    }
}

fn time(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{us:.0}us")
    }
}

impl Report {
    /// Adds a single value (see [`Figure`]).
    pub fn figure(&mut self, name: &str, endpoint: &str, value: f64, unit: &'static str) {
        self.figures.push(Figure {
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            value,
            unit,
        });
    }

    /// The scenario `name` does not apply to `endpoint` (e.g. no such
    /// runtime handler): reported as n/a, not as a failure.
    pub fn not_applicable(&mut self, name: &str, endpoint: &str, why: &anyhow::Error) {
        let reason = format!("{why:#}");
        let reason = reason.lines().next().unwrap_or_default();
        self.not_applicable.push(NotApplicable {
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            reason: reason.chars().take(160).collect(),
        });
    }

    /// Ratios A/B for every figure measured on A (n/a where B has none).
    pub fn compute_ratios(&mut self, a: &str, b: &str) {
        let mut ratios = Vec::new();
        for sa in self.results.iter().filter(|s| s.endpoint == a) {
            let sb = self
                .results
                .iter()
                .find(|s| s.endpoint == b && s.scenario == sa.scenario);
            ratios.push(Ratio {
                name: sa.scenario.clone(),
                median_a_over_b: sb.map(|sb| sa.median_us / sb.median_us),
                p99_a_over_b: sb.map(|sb| sa.p99_us / sb.p99_us),
            });
        }
        for fa in self.figures.iter().filter(|f| f.endpoint == a) {
            let fb = self
                .figures
                .iter()
                .find(|f| f.endpoint == b && f.name == fa.name);
            ratios.push(Ratio {
                name: fa.name.clone(),
                median_a_over_b: fb.map(|fb| fa.value / fb.value),
                p99_a_over_b: None,
            });
        }
        self.ratios = ratios;
    }

    pub fn print(&self) {
        let ep_w = self
            .results
            .iter()
            .map(|s| s.endpoint.len())
            .chain(self.figures.iter().map(|f| f.endpoint.len()))
            .max()
            .unwrap_or(8)
            .max(8);
        println!(
            "{:<34} {:<ep_w$} {:>6} {:>10} {:>10} {:>10} {:>10}",
            "latency", "endpoint", "n", "median", "p90", "p99", "max"
        );
        for (i, s) in self.results.iter().enumerate() {
            println!(
                "{:<34} {:<ep_w$} {:>6} {:>10} {:>10} {:>10} {:>10}",
                s.scenario,
                s.endpoint,
                s.iterations,
                time(s.median_us),
                time(s.p90_us),
                time(s.p99_us),
                time(s.max_us)
            );
            // An n/a endpoint's row right after the last row of the group.
            let next = self.results.get(i + 1).map(|n| n.scenario.as_str());
            if next != Some(s.scenario.as_str()) {
                for na in &self.not_applicable {
                    if s.scenario.starts_with(&format!("{} ", na.name)) && na.endpoint != s.endpoint
                    {
                        println!(
                            "{:<34} {:<ep_w$} {:>6} {:>10}",
                            s.scenario, na.endpoint, "", "n/a"
                        );
                    }
                }
            }
        }
        if !self.figures.is_empty() {
            println!();
            println!("{:<34} {:<ep_w$} {:>12}", "figure", "endpoint", "value");
            for f in &self.figures {
                let v = match f.unit {
                    "KiB" if f.value >= 1024.0 => format!("{:.1} MiB", f.value / 1024.0),
                    unit => format!("{:.1} {unit}", f.value),
                };
                println!("{:<34} {:<ep_w$} {:>12}", f.name, f.endpoint, v);
                let next = self
                    .figures
                    .iter()
                    .skip_while(|g| !std::ptr::eq(*g, f))
                    .nth(1);
                if next.is_none_or(|n| n.name != f.name) {
                    for na in &self.not_applicable {
                        if f.name.starts_with(&na.name) && na.endpoint != f.endpoint {
                            println!("{:<34} {:<ep_w$} {:>12}", f.name, na.endpoint, "n/a");
                        }
                    }
                }
            }
        }
        if !self.ratios.is_empty() {
            println!();
            println!("{:<34} {:>12} {:>12}", "A/B", "median", "p99");
            for r in &self.ratios {
                println!(
                    "{:<34} {:>12} {:>12}",
                    r.name,
                    r.median_a_over_b
                        .map(|v| format!("{v:.2}"))
                        .unwrap_or_else(|| "n/a".into()),
                    r.p99_a_over_b
                        .map(|v| format!("{v:.2}"))
                        .unwrap_or_default()
                );
            }
        }
        for na in &self.not_applicable {
            println!("n/a: {} on {}: {}", na.name, na.endpoint, na.reason);
        }
        for s in &self.skipped {
            println!("skipped: {s}");
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_applicable_keeps_the_first_line_of_the_reason_clipped() {
        let mut r = Report::default();
        let why = anyhow::anyhow!("{}\nsecond line", "x".repeat(300));
        r.not_applicable("ctr[embedded]", "containerd", &why);
        assert_eq!(r.not_applicable[0].reason, "x".repeat(160));
        r.figure("daemon rss idle", "crust", 1.0, "KiB");
        assert_eq!(r.figures[0].unit, "KiB");
    }

    #[test]
    fn ratios_are_a_over_b_and_na_where_b_has_none() {
        let mut r = Report::default();
        r.figure("f", "a", 4.0, "ms");
        r.figure("f", "b", 2.0, "ms");
        r.figure("only a", "a", 1.0, "ms");
        r.compute_ratios("a", "b");
        assert_eq!(r.ratios[0].median_a_over_b, Some(2.0));
        assert_eq!(r.ratios[1].median_a_over_b, None);
    }
}
