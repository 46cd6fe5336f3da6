//! Hostnames taken from Ingress `spec.rules[].host`, `spec.tls[].hosts` and
//! Gateway listener hostnames, validated before they reach /etc/hosts or a Corefile.
//!
//! Both files are line- and brace-structured text that other components parse:
//! a hostname carrying a newline, `#`, `{` or `}` could inject an entry into the
//! node's /etc/hosts or a plugin into the cluster's DNS server. Only RFC 1123
//! names (plus one leading `*.` label) get through, so nothing an Ingress author
//! writes can do more than name a host.

use std::{fmt, str::FromStr};

use thiserror::Error;

/// Longest name in presentation form without the trailing dot (RFC 1035 2.3.4).
const MAX_NAME_LEN: usize = 253;
/// Longest label (RFC 1035 2.3.4).
const MAX_LABEL_LEN: usize = 63;
/// The only wildcard form Ingress and Gateway API accept: one leading label.
const WILDCARD_PREFIX: &str = "*.";

/// Why a hostname was rejected. The input is quoted with `{:?}` so a hostile
/// value cannot break a log line either.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostnameError {
    /// Nothing (or only a dot) was given.
    #[error("hostname {input:?}: expected a dns name, got an empty string")]
    Empty {
        /// The rejected input.
        input: String,
    },
    /// The whole name is longer than 253 characters.
    #[error("hostname {input:?}: expected at most {MAX_NAME_LEN} characters, got {len}")]
    TooLong {
        /// The rejected input.
        input: String,
        /// Its length without the trailing dot.
        len: usize,
    },
    /// A character outside `[a-z0-9.-]` (after lowercasing), outside the wildcard.
    #[error("hostname {input:?}: expected only letters, digits, '-' and '.', got {found:?}")]
    InvalidChar {
        /// The rejected input.
        input: String,
        /// The first offending character.
        found: char,
    },
    /// Two dots in a row, or a leading dot.
    #[error("hostname {input:?}: expected non-empty labels between dots")]
    EmptyLabel {
        /// The rejected input.
        input: String,
    },
    /// A label longer than 63 characters.
    #[error("hostname {input:?}: label {label:?} is longer than {MAX_LABEL_LEN} characters")]
    LabelTooLong {
        /// The rejected input.
        input: String,
        /// The offending label.
        label: String,
    },
    /// A label that starts or ends with '-'.
    #[error("hostname {input:?}: label {label:?} must not start or end with '-'")]
    HyphenAtEdge {
        /// The rejected input.
        input: String,
        /// The offending label.
        label: String,
    },
    /// A `*` anywhere but as the whole first label.
    #[error("hostname {input:?}: expected '*' only as a whole leading label ('*.example.com')")]
    MisplacedWildcard {
        /// The rejected input.
        input: String,
    },
    /// An all-numeric last label: an IPv4 literal or not a name at all. Ingress
    /// rejects IPs in `host` too; /etc/hosts would read `1.2.3.4` as an address.
    #[error("hostname {input:?}: expected a name, got an all-numeric top-level label")]
    NumericTopLevel {
        /// The rejected input.
        input: String,
    },
}

/// A validated, lowercase DNS name, optionally with a single leading `*.` label.
///
/// The inner text only ever contains `[a-z0-9.-]` and, for wildcards, a leading
/// `*.`, so it is safe to place as one token on a line of /etc/hosts or a Corefile.
/// Ordered by its text, which gives stable rendering.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hostname(String);

impl Hostname {
    /// Validates `input` as an RFC 1123 name, lowercasing it and stripping one
    /// trailing dot; a single leading `*.` wildcard label is allowed.
    pub fn parse(input: &str) -> Result<Hostname, HostnameError> {
        let err_input = || input.to_owned();
        let trimmed = input.strip_suffix('.').unwrap_or(input);
        if trimmed.is_empty() {
            return Err(HostnameError::Empty { input: err_input() });
        }
        let lower = trimmed.to_ascii_lowercase();
        if lower.len() > MAX_NAME_LEN {
            return Err(HostnameError::TooLong {
                input: err_input(),
                len: lower.len(),
            });
        }
        let base = lower.strip_prefix(WILDCARD_PREFIX).unwrap_or(&lower);
        if base.contains('*') {
            return Err(HostnameError::MisplacedWildcard { input: err_input() });
        }
        if let Some(found) = base
            .chars()
            .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '.'))
        {
            return Err(HostnameError::InvalidChar {
                input: err_input(),
                found,
            });
        }
        for label in base.split('.') {
            if label.is_empty() {
                return Err(HostnameError::EmptyLabel { input: err_input() });
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(HostnameError::LabelTooLong {
                    input: err_input(),
                    label: label.to_owned(),
                });
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(HostnameError::HyphenAtEdge {
                    input: err_input(),
                    label: label.to_owned(),
                });
            }
        }
        let top = base.rsplit('.').next().unwrap_or(base);
        if top.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HostnameError::NumericTopLevel { input: err_input() });
        }
        Ok(Hostname(lower))
    }

    /// The normalised name: lowercase, no trailing dot, `*.` kept for wildcards.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a `*.example.com` wildcard (matching exactly one label).
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with(WILDCARD_PREFIX)
    }

    /// The name without its wildcard label: `example.com` for `*.example.com`,
    /// the name itself otherwise.
    pub fn base(&self) -> &str {
        self.0.strip_prefix(WILDCARD_PREFIX).unwrap_or(&self.0)
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Hostname {
    type Err = HostnameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Hostname::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_normalises_names() {
        let cases = [
            ("app.example.com", "app.example.com"),
            ("App.Example.COM.", "app.example.com"),
            ("localhost", "localhost"),
            ("a-b.c0.io", "a-b.c0.io"),
            ("*.example.com", "*.example.com"),
            ("*.Example.com.", "*.example.com"),
            ("0.example.com", "0.example.com"),
        ];
        for (input, want) in cases {
            let got = Hostname::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(got.as_str(), want, "{input:?}");
            assert_eq!(got.to_string(), want);
        }
    }

    #[test]
    fn wildcard_accessors() {
        let w = Hostname::parse("*.example.com").unwrap();
        assert!(w.is_wildcard());
        assert_eq!(w.base(), "example.com");
        let e = Hostname::parse("example.com").unwrap();
        assert!(!e.is_wildcard());
        assert_eq!(e.base(), "example.com");
        assert_eq!("x.io".parse::<Hostname>().unwrap().as_str(), "x.io");
    }

    #[test]
    fn length_limits() {
        let label63 = "a".repeat(63);
        assert!(Hostname::parse(&format!("{label63}.com")).is_ok());
        let label64 = "a".repeat(64);
        assert!(matches!(
            Hostname::parse(&format!("{label64}.com")),
            Err(HostnameError::LabelTooLong { .. })
        ));
        // 4 labels of 63 + 3 dots = 255 > 253.
        let long = [label63.as_str(); 4].join(".");
        assert!(matches!(
            Hostname::parse(&long),
            Err(HostnameError::TooLong { len: 255, .. })
        ));
        // Exactly 253 is fine, and a trailing dot does not count.
        let ok = format!("{}.{}.{}.{}", label63, label63, label63, "a".repeat(61));
        assert_eq!(ok.len(), 253);
        assert!(Hostname::parse(&ok).is_ok());
        assert!(Hostname::parse(&format!("{ok}.")).is_ok());
    }

    #[test]
    fn rejects_everything_that_could_inject_text() {
        let hostile = [
            "",
            ".",
            "..",
            "a..b",
            ".a.com",
            "a.com..",
            "a b.com",
            "a.com\n1.2.3.4 evil.com",
            "a.com\r",
            "a.com\t",
            "a.com#",
            "a.com}",
            "a.com{",
            "{$ENV}",
            "\"a.com\"",
            "'a.com'",
            "a\0.com",
            "a.com;",
            "a/b.com",
            "a_b.com",
            "-a.com",
            "a-.com",
            "a.-com",
            "*",
            "*.",
            "**.a.com",
            "a.*.com",
            "*a.com",
            "a.com.*",
            "*.*.a.com",
            "1.2.3.4",
            "10.0.0.1.",
            "ünïcode.com",
            "a.com\u{2028}",
        ];
        for input in hostile {
            let err = Hostname::parse(input).expect_err(input);
            let msg = err.to_string();
            assert!(!msg.contains('\n') && !msg.contains('\r'), "{msg}");
            assert!(msg.starts_with("hostname "), "{msg}");
        }
    }

    #[test]
    fn errors_name_the_input_and_the_expectation() {
        let err = Hostname::parse("a b.com").unwrap_err();
        assert_eq!(
            err.to_string(),
            "hostname \"a b.com\": expected only letters, digits, '-' and '.', got ' '"
        );
        let err = Hostname::parse("a.*.com").unwrap_err();
        assert_eq!(
            err.to_string(),
            "hostname \"a.*.com\": expected '*' only as a whole leading label ('*.example.com')"
        );
    }
}
