//! The static frontends source, `--frontends FILE`: for running without an API
//! server (debugging, the demo, the datapath tests).
//!
//! ```yaml
//! frontends:
//!   - ip: 203.0.113.10        # the LoadBalancer IP (v4 or v6)
//!     ports: [80, 443]        # TCP ports
//!     proxyProtocol: v1       # v1 or v2
//!     name: ingress-nginx     # optional, shown in status and logs
//! ```

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::frontends::{Frontend, ProxyVersion};

/// Errors reading or validating a frontends file.
#[derive(Debug, thiserror::Error)]
pub enum StaticSourceError {
    /// The file could not be read.
    #[error("failed to read frontends file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not the expected YAML shape.
    #[error("frontends file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's description, with line and column.
        message: String,
    },
    /// One entry is invalid.
    #[error("frontends file {path}: frontends[{index}].{field}: {expected}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Index of the entry in `frontends`.
        index: usize,
        /// The offending field.
        field: &'static str,
        /// What was expected instead.
        expected: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    frontends: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    ip: IpAddr,
    ports: Vec<u16>,
    proxy_protocol: String,
    #[serde(default)]
    name: Option<String>,
}

/// Reads and validates `path`, returning the frontends sorted and deduplicated.
pub fn load(path: &Path) -> Result<BTreeSet<Frontend>, StaticSourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| StaticSourceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parses the YAML `text` of the file at `path` (named in errors).
pub fn parse(path: &Path, text: &str) -> Result<BTreeSet<Frontend>, StaticSourceError> {
    let file: File = serde_yaml::from_str(text).map_err(|e| StaticSourceError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let invalid = |index, field, expected: &str| StaticSourceError::Invalid {
        path: path.to_path_buf(),
        index,
        field,
        expected: expected.to_string(),
    };
    let mut out = BTreeSet::new();
    for (index, e) in file.frontends.into_iter().enumerate() {
        let version: ProxyVersion = e
            .proxy_protocol
            .parse()
            .map_err(|msg: String| invalid(index, "proxyProtocol", &msg))?;
        if e.ip.is_unspecified() || e.ip.is_loopback() || e.ip.is_multicast() {
            return Err(invalid(
                index,
                "ip",
                &format!("a unicast LoadBalancer address, got {}", e.ip),
            ));
        }
        if e.ports.is_empty() {
            return Err(invalid(index, "ports", "at least one TCP port"));
        }
        if e.ports.contains(&0) {
            return Err(invalid(index, "ports", "TCP ports from 1 to 65535, got 0"));
        }
        let source = match &e.name {
            Some(n) => format!("file {} ({n})", path.display()),
            None => format!("file {}", path.display()),
        };
        for port in e.ports {
            out.insert(Frontend {
                ip: e.ip,
                port,
                version,
                source: source.clone(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<BTreeSet<Frontend>, StaticSourceError> {
        parse(Path::new("f.yaml"), text)
    }

    #[test]
    fn parses_both_families_and_versions() {
        let got = p(
            "frontends:\n- ip: 203.0.113.10\n  ports: [80, 443]\n  proxyProtocol: v1\n\
                     - ip: 2001:db8::10\n  ports: [80]\n  proxyProtocol: v2\n  name: lb6\n",
        )
        .expect("valid");
        assert_eq!(got.len(), 3);
        let v6 = got.iter().find(|f| f.ip.is_ipv6()).expect("v6 entry");
        assert_eq!(v6.version, ProxyVersion::V2);
        assert_eq!(v6.source, "file f.yaml (lb6)");
    }

    #[test]
    fn errors_name_the_entry_and_field() {
        let err = p("frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v3\n")
            .expect_err("v3 is invalid")
            .to_string();
        assert_eq!(
            err,
            "frontends file f.yaml: frontends[0].proxyProtocol: expected v1 or v2, got \"v3\""
        );
        let err = p("frontends:\n- ip: 127.0.0.1\n  ports: [80]\n  proxyProtocol: v1\n")
            .expect_err("loopback is invalid")
            .to_string();
        assert!(err.contains("frontends[0].ip"), "{err}");
        let err = p("frontends:\n- ip: 203.0.113.1\n  ports: []\n  proxyProtocol: v1\n")
            .expect_err("no ports")
            .to_string();
        assert!(err.contains("frontends[0].ports: at least one"), "{err}");
    }

    #[test]
    fn unknown_fields_and_bad_addresses_are_rejected() {
        let err = p("frontends:\n- ip: 203.0.113.1\n  port: [80]\n  proxyProtocol: v1\n")
            .expect_err("typo")
            .to_string();
        assert!(err.contains("unknown field `port`"), "{err}");
        assert!(
            p("frontends:\n- ip: 203.0.113.300\n  ports: [80]\n  proxyProtocol: v1\n").is_err()
        );
    }
}
