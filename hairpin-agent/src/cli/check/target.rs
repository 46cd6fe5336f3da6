//! What `check` is asked about: `host|ip[:port]`.

use serde::Serialize;

/// A parsed target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Target {
    /// Name or IP literal, without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// TLS probe.
    pub tls: bool,
}

/// A target that is none of `check`'s spellings (the argument as given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("target {0:?}: expected host, ip, host:port, ip:port or [ipv6]:port")]
pub struct BadTarget(pub String);

/// Parses `host|ip[:port]`, bracketed IPv6 included; port 443 implies TLS.
pub(crate) fn parse_target(s: &str, tls: bool) -> Result<Target, BadTarget> {
    let bad = || BadTarget(s.to_owned());
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (h.to_string(), port)
    } else if s.matches(':').count() > 1 {
        (s.to_string(), None) // a bare IPv6 address
    } else if let Some((h, p)) = s.split_once(':') {
        (h.to_string(), Some(p.parse::<u16>().map_err(|_| bad())?))
    } else {
        (s.to_string(), None)
    };
    if host.is_empty() || port == Some(0) {
        return Err(bad());
    }
    let port = port.unwrap_or(if tls { 443 } else { 80 });
    Ok(Target {
        host,
        port,
        tls: tls || port == 443,
    })
}
