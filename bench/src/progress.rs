//! The progress bar shown while a scenario runs (cleared when it is done,
//! so that only the report stays on the terminal).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:<28} [{bar:40}] {pos}/{len} {elapsed_precise}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_string());
    pb
}
