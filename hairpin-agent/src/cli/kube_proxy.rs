//! What kube-proxy programmed on this node, read from `iptables-save -t nat`,
//! `ip6tables-save -t nat`, `nft list ruleset` and the `kube-ipvs0` link: which mode
//! it runs in, and which LoadBalancer IPs it short-circuits to the ingress (the reason
//! in-cluster clients never pass the cloud LB and get no PROXY header).

use std::{net::IpAddr, process::Command};

use serde::Serialize;

/// A kube-proxy mode found on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// KUBE-SERVICES in the nat table.
    Iptables,
    /// `table ip kube-proxy` / `table ip6 kube-proxy`.
    Nftables,
    /// The `kube-ipvs0` link.
    Ipvs,
}

impl Mode {
    /// Lowercase name, as in the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        }
    }
}

/// One destination kube-proxy rewrites before it leaves the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ShortCircuit {
    /// The destination IP.
    pub ip: IpAddr,
    /// The TCP port; `None` for every port (IPVS binds the whole address).
    pub port: Option<u16>,
    /// The mode whose rule it is.
    pub mode: Mode,
    /// The rule's comment or target, naming the Service.
    pub rule: String,
}

/// What kube-proxy did on this node.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct KubeProxy {
    /// Modes found (normally one).
    pub modes: Vec<Mode>,
    /// Destinations short-circuited.
    pub rules: Vec<ShortCircuit>,
    /// Tools that could not be run, and similar caveats.
    pub notes: Vec<String>,
    /// Whether iptables-save, ip6tables-save or nft ran: when none did (the agent's
    /// image has none of them), nothing here says what kube-proxy does.
    pub read: bool,
}

impl KubeProxy {
    /// Reads the node's rules (this network namespace's).
    pub(crate) fn observe() -> KubeProxy {
        let mut kp = KubeProxy::default();
        for tool in ["iptables-save", "ip6tables-save"] {
            match tool_output(tool, &["-t", "nat"]) {
                Ok(text) => {
                    kp.read = true;
                    let (chain, rules) = parse_iptables_save(&text);
                    if chain && !kp.modes.contains(&Mode::Iptables) {
                        kp.modes.push(Mode::Iptables);
                    }
                    kp.rules.extend(rules);
                }
                Err(e) => kp.notes.push(e.to_string()),
            }
        }
        match tool_output("nft", &["list", "ruleset"]) {
            Ok(text) => {
                kp.read = true;
                let (table, rules) = parse_nft_ruleset(&text);
                if table {
                    kp.modes.push(Mode::Nftables);
                }
                kp.rules.extend(rules);
            }
            Err(e) => kp.notes.push(e.to_string()),
        }
        // Absent link: not IPVS mode. That is the common case, not worth a note.
        if let Ok(text) = tool_output("ip", &["-o", "addr", "show", "dev", "kube-ipvs0"]) {
            kp.modes.push(Mode::Ipvs);
            kp.rules.extend(parse_ipvs_addrs(&text));
        }
        kp
    }

    /// The rules that short-circuit `ip:port`.
    pub(crate) fn matching(&self, ip: IpAddr, port: u16) -> Vec<&ShortCircuit> {
        self.rules
            .iter()
            .filter(|r| r.ip == ip && r.port.is_none_or(|p| p == port))
            .collect()
    }
}

/// A tool that could not tell what it printed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    /// The tool could not be started (absent from this node's PATH, usually).
    #[error("could not run {tool}: {source}")]
    Spawn {
        /// The tool's name.
        tool: String,
        /// Why it could not be started.
        source: std::io::Error,
    },
    /// The tool ran and failed.
    #[error("{tool} {args} failed ({status}): {stderr}")]
    Failed {
        /// The tool's name.
        tool: String,
        /// Its arguments, space-separated.
        args: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it wrote on stderr, trimmed.
        stderr: String,
    },
}

/// What `tool args` prints on stdout.
fn tool_output(tool: &str, args: &[&str]) -> Result<String, ToolError> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|source| ToolError::Spawn {
            tool: tool.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(ToolError::Failed {
            tool: tool.to_owned(),
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `iptables-save -t nat` output: whether a KUBE-SERVICES chain exists, and each
/// `-A KUBE-SERVICES -d IP/len ... --dport PORT` rule (LoadBalancer, external and cluster IPs).
pub(crate) fn parse_iptables_save(text: &str) -> (bool, Vec<ShortCircuit>) {
    let chain = text.lines().any(|l| l.starts_with(":KUBE-SERVICES "));
    let rules = text
        .lines()
        .filter_map(|l| l.strip_prefix("-A KUBE-SERVICES "))
        .filter_map(|rule| {
            let words = shell_words(rule);
            let after = |flag: &str| {
                words
                    .iter()
                    .position(|w| w == flag)
                    .and_then(|i| words.get(i + 1))
            };
            let dest = after("-d")?;
            let ip: IpAddr = dest.split('/').next()?.parse().ok()?;
            let port = after("--dport").and_then(|p| p.parse().ok());
            let rule = after("--comment")
                .or_else(|| after("-j"))
                .cloned()
                .unwrap_or_default();
            Some(ShortCircuit {
                ip,
                port,
                mode: Mode::Iptables,
                rule,
            })
        })
        .collect();
    (chain, rules)
}

/// Splits an iptables rule into words, honouring double quotes (comments have spaces).
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any) = (false, false);
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

/// Parses `nft list ruleset`: whether kube-proxy's nftables table exists, and each
/// `ADDR . tcp . PORT : goto TARGET` element of its maps (`service-ips` holds cluster,
/// external and LoadBalancer IPs; LoadBalancer ones go to `external-...` chains).
pub(crate) fn parse_nft_ruleset(text: &str) -> (bool, Vec<ShortCircuit>) {
    let mut table = false;
    let mut rules = Vec::new();
    let mut inside = false;
    let mut depth = 0i32;
    let mut tokens: Vec<String> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if depth == 0 {
            inside = t == "table ip kube-proxy {" || t == "table ip6 kube-proxy {";
            table |= inside;
        }
        depth += t.matches('{').count() as i32 - t.matches('}').count() as i32;
        if inside {
            tokens.extend(
                t.split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
                    .filter(|w| !w.is_empty())
                    .map(str::to_string),
            );
        }
    }
    for w in tokens.windows(8) {
        if w[1] != "." || w[2] != "tcp" || w[3] != "." || w[5] != ":" || w[6] != "goto" {
            continue;
        }
        if let (Ok(ip), Ok(port)) = (w[0].parse::<IpAddr>(), w[4].parse::<u16>()) {
            rules.push(ShortCircuit {
                ip,
                port: Some(port),
                mode: Mode::Nftables,
                rule: w[7].clone(),
            });
        }
    }
    (table, rules)
}

/// Parses `ip -o addr show dev kube-ipvs0`: every address bound there is answered by
/// IPVS on the node itself, on every port.
pub(crate) fn parse_ipvs_addrs(text: &str) -> Vec<ShortCircuit> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|t| *t == "inet" || *t == "inet6")?;
            let ip: IpAddr = w.next()?.split('/').next()?.parse().ok()?;
            Some(ShortCircuit {
                ip,
                port: None,
                mode: Mode::Ipvs,
                rule: "bound on kube-ipvs0".into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
