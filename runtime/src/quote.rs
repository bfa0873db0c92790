//! Bounded quoting of what a client sent, for error messages: a value is
//! shown as `{:?}` shows it, cut to [`MAX_QUOTED`] bytes, with its length
//! when cut. A 10 KB image name must not become a 20 KB `grpc-message`
//! header (clients accept 16 KiB and see `RST_STREAM` instead of the
//! error).
//!
//! The same contract as the workspace's `crust-quote` crate (being added
//! on another branch); once it lands this module re-exports it.

use std::fmt;

/// The most bytes of one untrusted value a message shows.
pub const MAX_QUOTED: usize = 256;

/// `value` as `{:?}` shows it, cut to at most [`MAX_QUOTED`] bytes of
/// escaped text; a cut value reads `"abc"... (N bytes)`.
pub fn quote(value: &str) -> Quoted<'_> {
    Quoted(value)
}

#[derive(Clone, Copy)]
pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::with_capacity(MAX_QUOTED.min(self.0.len()) + 2);
        let mut whole = true;
        for c in self.0.chars() {
            let escaped: String = match c {
                '\'' | ' ' => c.to_string(),
                c => c.escape_debug().collect(),
            };
            if out.len() + escaped.len() > MAX_QUOTED {
                whole = false;
                break;
            }
            out.push_str(&escaped);
        }
        write!(f, "\"{out}\"")?;
        if !whole {
            write!(f, "... ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `text` (free text: an error of a lower layer that may repeat input) cut
/// to at most `max` bytes at a character boundary, marked when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_read_as_debug() {
        for s in [
            "",
            "abc",
            "a\"b",
            "tab\there",
            "nul\0",
            "é'x",
            "a\\b",
            "a b",
        ] {
            assert_eq!(quote(s).to_string(), format!("{s:?}"), "{s:?}");
        }
    }

    #[test]
    fn long_values_are_cut_and_say_their_length() {
        let long = "x".repeat(10_000);
        assert_eq!(
            quote(&long).to_string(),
            format!("\"{}\"... (10000 bytes)", "x".repeat(MAX_QUOTED))
        );
        // An escape is never split, and the bound holds for escapes too.
        let q = quote(&"\n".repeat(1000)).to_string();
        assert!(q.starts_with("\"\\n\\n") && q.ends_with("\"... (1000 bytes)"));
        assert!(q.len() <= MAX_QUOTED + 30, "{}", q.len());
    }

    #[test]
    fn clip_cuts_at_a_char_boundary() {
        assert_eq!(clip("short", 10), "short");
        let s = "é".repeat(10);
        let c = clip(&s, 5);
        assert_eq!(c, "éé... (20 bytes)");
    }
}
