//! The part of `/status` about the relay of frontends: its listeners, and what
//! keeps one from serving (a bind that failed, no sk_lookup program), which leaves
//! the relayed frontends of that family going as before hairpin.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// The relay of frontends' listeners, one per family.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct RelayStatus {
    /// Bound and registered listeners.
    pub listeners: Vec<SocketAddr>,
    /// Families the relay does not serve, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unserved: Vec<UnservedFamily>,
}

/// A family whose relayed frontends no listener serves: their connects go as
/// before hairpin (fail open), as do the kernel path's fallbacks to the relay.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct UnservedFamily {
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// The listen address the listener was to bind, when it got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// What failed.
    pub what: UnservedStep,
    /// The error, as the OS or the kernel gave it.
    pub error: String,
    /// What the operator can do.
    pub fix: String,
}

/// The step of starting a relay listener that failed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum UnservedStep {
    /// No port of the listener's range could be bound.
    Bind,
    /// The liveness map refused the listener.
    Register,
    /// The sk_lookup program did not load or link: no connection reaches a slot.
    Steering,
    /// The slots map cannot be read.
    Slots,
}

impl UnservedStep {
    /// As `/status` spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UnservedStep::Bind => "bind",
            UnservedStep::Register => "register",
            UnservedStep::Steering => "steering",
            UnservedStep::Slots => "slots",
        }
    }

    /// Whether trying again can serve the family: a port may be freed, an address
    /// come up; steering and the slots map do not come right by retrying.
    pub(crate) fn retried(self) -> bool {
        matches!(self, UnservedStep::Bind | UnservedStep::Register)
    }
}

impl UnservedFamily {
    /// Whether `ip` (a frontend's address) is of this family.
    pub(crate) fn covers(&self, ip: IpAddr) -> bool {
        let v4 = ip.to_canonical().is_ipv4();
        (self.family == "IPv4") == v4
    }

    /// One sentence: the family, what failed and why, the consequence.
    pub(crate) fn describe(&self) -> String {
        let at = self.address.map(|a| format!(" on {a}")).unwrap_or_default();
        format!(
            "the relay's {} listener is not served{at} ({}: {}): relayed {} connects go as before hairpin",
            self.family,
            self.what.as_str(),
            self.error,
            self.family
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_covers_its_own_addresses_and_says_what_failed() {
        let u = UnservedFamily {
            family: "IPv6".into(),
            address: Some("fd68:6169:7270:696e::1".parse().expect("ip")),
            what: UnservedStep::Bind,
            error: "Address in use (os error 98)".into(),
            fix: "free a port".into(),
        };
        assert!(u.covers("2001:db8::1".parse().expect("ip")));
        assert!(!u.covers("203.0.113.10".parse().expect("ip")));
        assert!(!u.covers("::ffff:203.0.113.10".parse().expect("ip")));
        assert_eq!(
            u.describe(),
            "the relay's IPv6 listener is not served on fd68:6169:7270:696e::1 (bind: \
             Address in use (os error 98)): relayed IPv6 connects go as before hairpin"
        );
    }
}
