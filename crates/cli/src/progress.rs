//! Progress bars for long runs: nothing for the first second, then a bar (known total)
//! or a spinner with a rate on stderr; indicatif hides itself when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::{Duration, Instant};

/// A progress display that appears only on runs longer than a second.
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: bool,
}

impl Progress {
    /// A hidden progress display for `what`.
    pub fn new(what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_message(what.to_string());
        Progress { bar, start: Instant::now(), shown: false }
    }

    /// Reports `done` of `total` (if known) units.
    pub fn update(&mut self, done: u64, total: Option<u64>) {
        if !self.shown && self.start.elapsed() >= Duration::from_secs(1) {
            self.shown = true;
            let style = match total {
                Some(t) => {
                    self.bar.set_length(t);
                    ProgressStyle::with_template("{msg} [{bar:40}] {human_pos}/{human_len} ({per_sec}, eta {eta})")
                }
                None => ProgressStyle::with_template("{spinner} {msg}: {human_pos} requests ({per_sec})"),
            };
            self.bar.set_style(style.expect("valid template").progress_chars("=> "));
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar.enable_steady_tick(Duration::from_millis(200));
        }
        if let (true, Some(t)) = (self.shown, total) {
            self.bar.set_length(t); // a total may grow (a destage while writes arrive)
        }
        self.bar.set_position(done);
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
