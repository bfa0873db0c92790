//! The signal StopContainer sends first: the request's `stop_signal`, else
//! the image's `StopSignal`, else SIGTERM.

use crust_api::v1::{ContainerConfig, Signal};
use crust_quote::quote_os;

use crate::{ImageConfig, SpecError};

/// SIGRTMIN and SIGRTMAX as glibc programs see them (Docker's table).
const RTMIN: i32 = 34;
const RTMAX: i32 = 64;

fn by_name(name: &str) -> Option<i32> {
    let n = name.strip_prefix("SIG").unwrap_or(name);
    Some(match n {
        "ABRT" | "IOT" => libc::SIGABRT,
        "ALRM" => libc::SIGALRM,
        "BUS" => libc::SIGBUS,
        "CHLD" | "CLD" => libc::SIGCHLD,
        "CONT" => libc::SIGCONT,
        "FPE" => libc::SIGFPE,
        "HUP" => libc::SIGHUP,
        "ILL" => libc::SIGILL,
        "INT" => libc::SIGINT,
        "IO" | "POLL" => libc::SIGIO,
        "KILL" => libc::SIGKILL,
        "PIPE" => libc::SIGPIPE,
        "PROF" => libc::SIGPROF,
        "PWR" => libc::SIGPWR,
        "QUIT" => libc::SIGQUIT,
        "SEGV" => libc::SIGSEGV,
        "STKFLT" => libc::SIGSTKFLT,
        "STOP" => libc::SIGSTOP,
        "SYS" => libc::SIGSYS,
        "TERM" => libc::SIGTERM,
        "TRAP" => libc::SIGTRAP,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "URG" => libc::SIGURG,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "VTALRM" => libc::SIGVTALRM,
        "WINCH" => libc::SIGWINCH,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "RTMIN" => RTMIN,
        "RTMAX" => RTMAX,
        _ => {
            if let Some(k) = n
                .strip_prefix("RTMIN+")
                .or_else(|| n.strip_prefix("RTMINPLUS"))
            {
                let k: i32 = k.parse().ok()?;
                return (1..=RTMAX - RTMIN).contains(&k).then_some(RTMIN + k);
            }
            if let Some(k) = n
                .strip_prefix("RTMAX-")
                .or_else(|| n.strip_prefix("RTMAXMINUS"))
            {
                let k: i32 = k.parse().ok()?;
                return (1..=RTMAX - RTMIN).contains(&k).then_some(RTMAX - k);
            }
            return None;
        }
    })
}

/// Parses a signal as Docker images write it: `SIGQUIT`, `QUIT`, `3`,
/// `SIGRTMIN+3` (and the CRI enum's `SIGRTMINPLUS3` / `SIGRTMAXMINUS3`).
pub fn parse_signal(field: &str, s: &str) -> Result<i32, SpecError> {
    let bad = || SpecError::invalid(field, format!("unknown signal {s}", s = quote_os(&s)));
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let n: i32 = s.parse().map_err(|_| bad())?;
        return if (1..=RTMAX).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        };
    }
    by_name(&s.to_ascii_uppercase()).ok_or_else(bad)
}

/// The signal to stop the container with.
pub fn stop_signal(config: &ContainerConfig, image: &ImageConfig) -> Result<i32, SpecError> {
    let sig = Signal::try_from(config.stop_signal).map_err(|_| {
        SpecError::invalid(
            "config.stop_signal",
            format!("unknown signal {}", config.stop_signal),
        )
    })?;
    if sig != Signal::RuntimeDefault {
        return parse_signal("config.stop_signal", sig.as_str_name());
    }
    if image.stop_signal.is_empty() {
        return Ok(libc::SIGTERM);
    }
    parse_signal("image.config.StopSignal", &image.stop_signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(s: &str) -> ImageConfig {
        ImageConfig {
            stop_signal: s.into(),
            ..Default::default()
        }
    }

    #[test]
    fn default_is_sigterm() {
        assert_eq!(
            stop_signal(&ContainerConfig::default(), &img("")).unwrap(),
            15
        );
    }

    #[test]
    fn image_forms() {
        for (s, n) in [
            ("SIGQUIT", 3),
            ("QUIT", 3),
            ("sigint", 2),
            ("9", 9),
            ("SIGRTMIN+3", 37),
            ("RTMAX-1", 63),
            ("SIGRTMAX", 64),
            ("SIGWINCH", 28),
        ] {
            assert_eq!(
                stop_signal(&ContainerConfig::default(), &img(s)).unwrap(),
                n,
                "{s}"
            );
        }
        for bad in ["SIGNOPE", "0", "65", "-1", "RTMIN+31", "RTMIN+x", "1x"] {
            let e = stop_signal(&ContainerConfig::default(), &img(bad)).unwrap_err();
            assert_eq!(e.field(), "image.config.StopSignal", "{bad}");
        }
    }

    #[test]
    fn request_wins() {
        let c = ContainerConfig {
            stop_signal: Signal::Sigusr1 as i32,
            ..Default::default()
        };
        assert_eq!(stop_signal(&c, &img("SIGQUIT")).unwrap(), 10);
        for sig in [
            Signal::Sigrtmin,
            Signal::Sigrtminplus15,
            Signal::Sigrtmaxminus14,
            Signal::Sigrtmax,
            Signal::Sigcld,
            Signal::Sigpoll,
            Signal::Sigiot,
        ] {
            let c = ContainerConfig {
                stop_signal: sig as i32,
                ..Default::default()
            };
            assert!(stop_signal(&c, &img("")).is_ok(), "{sig:?}");
        }
        // Every enum value maps.
        for v in 1..=65 {
            let c = ContainerConfig {
                stop_signal: v,
                ..Default::default()
            };
            assert!(stop_signal(&c, &img("")).is_ok(), "{v}");
        }
        let c = ContainerConfig {
            stop_signal: 99,
            ..Default::default()
        };
        assert_eq!(
            stop_signal(&c, &img("")).unwrap_err().field(),
            "config.stop_signal"
        );
    }
}
