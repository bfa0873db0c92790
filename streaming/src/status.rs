//! The `metav1.Status` the v4 error stream carries, and the text older
//! protocols carry instead.

use serde::Serialize;

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Cause<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    message: String,
}

#[derive(Serialize)]
struct Details<'a> {
    causes: Vec<Cause<'a>>,
}

#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

/// How an exec or attach ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    ExitCode(i32),
    Error(String),
}

impl Outcome {
    /// The v4/v5 form: JSON `metav1.Status`.
    pub(crate) fn to_v4_json(&self) -> Vec<u8> {
        let status = match self {
            Outcome::Success => Status {
                metadata: Empty {},
                status: "Success",
                message: None,
                reason: None,
                details: None,
                code: None,
            },
            Outcome::ExitCode(code) => {
                // Clients parse the cause as an unsigned byte.
                let code = code.clamp(&1, &255);
                Status {
                    metadata: Empty {},
                    status: "Failure",
                    message: Some(format!(
                        "command terminated with non-zero exit code: command terminated with exit code {code}"
                    )),
                    reason: Some("NonZeroExitCode"),
                    details: Some(Details {
                        causes: vec![Cause {
                            reason: Some("ExitCode"),
                            message: code.to_string(),
                        }],
                    }),
                    code: None,
                }
            }
            Outcome::Error(msg) => Status {
                metadata: Empty {},
                status: "Failure",
                message: Some(format!("Internal error occurred: {msg}")),
                reason: Some("InternalError"),
                details: Some(Details {
                    causes: vec![Cause {
                        reason: None,
                        message: msg.clone(),
                    }],
                }),
                code: Some(500),
            },
        };
        serde_json::to_vec(&status).expect("a Status serializes")
    }

    /// The v1-v3 form: nothing on success, the message otherwise.
    pub(crate) fn to_text(&self) -> Vec<u8> {
        match self {
            Outcome::Success => Vec::new(),
            Outcome::ExitCode(code) => {
                format!("command terminated with non-zero exit code: command terminated with exit code {code}").into_bytes()
            }
            Outcome::Error(msg) => format!("Internal error occurred: {msg}").into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// Whatever the backend said, the v4 status is JSON client-go
        /// decodes, with the exit code as an unsigned byte cause.
        #[test]
        fn statuses_are_always_decodable(code in any::<i32>(), msg in any::<String>()) {
            let v: serde_json::Value = serde_json::from_slice(&Outcome::ExitCode(code).to_v4_json()).unwrap();
            let cause = v["details"]["causes"][0]["message"].as_str().unwrap().parse::<u8>().unwrap();
            prop_assert!(cause >= 1);
            let v: serde_json::Value =
                serde_json::from_slice(&Outcome::Error(msg.clone()).to_v4_json()).unwrap();
            prop_assert_eq!(v["details"]["causes"][0]["message"].as_str(), Some(msg.as_str()));
            prop_assert_eq!(v["status"].as_str(), Some("Failure"));
        }
    }

    #[test]
    fn v4_statuses_are_what_client_go_decodes() {
        assert_eq!(
            String::from_utf8(Outcome::Success.to_v4_json()).unwrap(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        let v: serde_json::Value =
            serde_json::from_slice(&Outcome::ExitCode(42).to_v4_json()).unwrap();
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "42");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("command terminated with non-zero exit code")
        );
        let v: serde_json::Value =
            serde_json::from_slice(&Outcome::Error("boom".into()).to_v4_json()).unwrap();
        assert_eq!(v["reason"], "InternalError");
        assert_eq!(v["code"], 500);
        assert!(Outcome::Success.to_text().is_empty());
    }
}
