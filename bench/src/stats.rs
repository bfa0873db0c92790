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

#[derive(Debug, Serialize)]
pub struct Ratio {
    pub name: String,
    pub median_a_over_b: f64,
    pub p99_a_over_b: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub results: Vec<Summary>,
    pub figures: Vec<Figure>,
    pub ratios: Vec<Ratio>,
    pub skipped: Vec<String>,
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
    /// Ratios A/B for every figure measured on exactly the two endpoints.
    pub fn compute_ratios(&mut self, a: &str, b: &str) {
        let mut ratios = Vec::new();
        for sa in self.results.iter().filter(|s| s.endpoint == a) {
            if let Some(sb) = self
                .results
                .iter()
                .find(|s| s.endpoint == b && s.scenario == sa.scenario)
            {
                ratios.push(Ratio {
                    name: sa.scenario.clone(),
                    median_a_over_b: sa.median_us / sb.median_us,
                    p99_a_over_b: Some(sa.p99_us / sb.p99_us),
                });
            }
        }
        for fa in self.figures.iter().filter(|f| f.endpoint == a) {
            if let Some(fb) = self
                .figures
                .iter()
                .find(|f| f.endpoint == b && f.name == fa.name)
            {
                ratios.push(Ratio {
                    name: fa.name.clone(),
                    median_a_over_b: fa.value / fb.value,
                    p99_a_over_b: None,
                });
            }
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
        for s in &self.results {
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
            }
        }
        if !self.ratios.is_empty() {
            println!();
            println!("{:<34} {:>12} {:>12}", "A/B", "median", "p99");
            for r in &self.ratios {
                println!(
                    "{:<34} {:>12.2} {:>12}",
                    r.name,
                    r.median_a_over_b,
                    r.p99_a_over_b
                        .map(|v| format!("{v:.2}"))
                        .unwrap_or_default()
                );
            }
        }
        for s in &self.skipped {
            println!("skipped: {s}");
        }
    }
}
