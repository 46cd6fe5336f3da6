//! CoreDNS rewrites that send a LoadBalancer's hostnames to the hairpin relay's
//! ClusterIP Service, as text transformations of a Corefile (mode A) or as the
//! content of an import file in `coredns-custom` (mode B).
//!
//! Rewrite semantics, from the rewrite plugin's README and source
//! (coredns/coredns `plugin/rewrite/README.md` and `name.go`):
//! - `rewrite name exact FROM TO` always rewrites the answer back to FROM
//!   ("answers for rewrites of type `exact` are always rewritten"; `newExactNameRule`
//!   sets auto), in every CoreDNS release. We add no `answer` option to it: before
//!   `answer auto` existed (coredns/coredns#4473, 2021; in the v1.8.5 README) an
//!   exact rule with options was a parse error that would stop CoreDNS loading.
//! - `rewrite name regex FROM TO answer auto` maps the rewritten question name in the
//!   answer back to whatever name the client asked (`responseRuleFor` with auto
//!   builds a remap from the rewritten name to the original). That is the only way
//!   to point a whole wildcard at one target and still answer with the name asked
//!   (coredns/coredns#2389), so wildcard rules need CoreDNS with `answer auto`.
//!
//! The queried name CoreDNS matches is lowercase and fully qualified (`a.b.` with
//! the trailing dot), hence the `\.$` anchor in wildcard patterns.

use std::collections::BTreeSet;

use thiserror::Error;

use super::hostname::Hostname;

/// Trailing comment that marks each line hairpin adds to a Corefile, after
/// hairpin-proxy's `# Added by hairpin-proxy` (which this does not match).
pub const MARKER: &str = "# Added by hairpin";

/// Key in the `coredns-custom` ConfigMap for mode B. k3s and RKE2 import
/// `/etc/coredns/custom/*.override` and AKS `custom/*.override` inside the main
/// server block, so the key must end in `.override`.
pub const IMPORT_KEY: &str = "hairpin.override";

/// Server keys of the main server block: the root zone on the default port.
const ROOT_KEYS: [&str; 4] = [".", ".:53", "dns://.", "dns://.:53"];

/// Largest Corefile [`apply`] edits: a ConfigMap's data is limited to 1 MiB by the
/// API server, so anything larger did not come from one and is not rewritten.
pub const MAX_COREFILE_BYTES: usize = 1024 * 1024;

/// Indentation used when the server block has no line to copy it from.
const DEFAULT_INDENT: &str = "    ";

/// Why a Corefile could not be edited.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CorefileError {
    /// No `.:53 {` / `. {` server block to put the rewrites in.
    #[error(
        "corefile: expected a main server block opening line such as \".:53 {{\" or \". {{\", found none"
    )]
    NoMainServerBlock,
    /// The server block's opening line is the file's last line, without a newline.
    #[error(
        "corefile: main server block opened at line {line} has no body (expected a newline after '{{')"
    )]
    UnterminatedServerBlock {
        /// 1-based line of the opening line.
        line: usize,
    },
    /// The Corefile is larger than [`MAX_COREFILE_BYTES`].
    #[error(
        "corefile: expected at most {MAX_COREFILE_BYTES} bytes (the ConfigMap size limit), got {len}"
    )]
    TooLarge {
        /// Its size in bytes.
        len: usize,
    },
    /// A rewrite target must be one exact name (the relay's Service FQDN).
    #[error("rewrite target {target:?}: expected an exact service name, got a wildcard")]
    WildcardTarget {
        /// The rejected target.
        target: String,
    },
}

/// One rewrite: queries for `host` are answered with the addresses of `target`,
/// under the name the client asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rewrite {
    // Field order gives the rendering order: exact names before wildcards, so a
    // specific name wins over a wildcard covering it (rewrite rules `stop` at the
    // first match), then by name.
    wildcard: bool,
    host: Hostname,
    target: Hostname,
}

impl Rewrite {
    /// A rewrite of `host` (exact or `*.` wildcard) to `target`, the FQDN of the
    /// ClusterIP Service over the hairpin DaemonSet, for example
    /// `hairpin.hairpin-system.svc.cluster.local`.
    pub fn new(host: Hostname, target: Hostname) -> Result<Rewrite, CorefileError> {
        if target.is_wildcard() {
            return Err(CorefileError::WildcardTarget {
                target: target.to_string(),
            });
        }
        Ok(Rewrite {
            wildcard: host.is_wildcard(),
            host,
            target,
        })
    }

    /// The name being rewritten.
    pub fn host(&self) -> &Hostname {
        &self.host
    }

    /// The name it is rewritten to.
    pub fn target(&self) -> &Hostname {
        &self.target
    }

    /// The `rewrite` directive, without indentation or marker.
    ///
    /// Both names are validated [`Hostname`]s, so the line holds only
    /// `[a-z0-9.-]`, the pattern's `^[]\.+$` and spaces: no newline, quote, `#`,
    /// `{` or `}` can reach the Corefile from an Ingress.
    pub fn directive(&self) -> String {
        if self.wildcard {
            // `*.` covers exactly one label (Ingress and Gateway API semantics).
            let base = self.host.base().replace('.', "\\.");
            format!(
                "rewrite name regex ^[^.]+\\.{base}\\.$ {} answer auto",
                self.target
            )
        } else {
            format!("rewrite name exact {} {}", self.host, self.target)
        }
    }
}

/// The directives for `rewrites`, deduplicated, in rendering order.
fn directives(rewrites: &[Rewrite]) -> Vec<String> {
    let sorted: BTreeSet<&Rewrite> = rewrites.iter().collect();
    sorted.into_iter().map(Rewrite::directive).collect()
}

/// Whether a Corefile line is one hairpin added.
fn is_ours(line: &str) -> bool {
    line.trim_end().ends_with(MARKER)
}

/// A line without its comment: Corefile comments start with a `#` that begins a
/// token (at the start of the line or after whitespace).
fn without_comment(line: &str) -> &str {
    let mut prev_is_space = true;
    for (i, c) in line.char_indices() {
        if c == '#' && prev_is_space {
            return &line[..i];
        }
        prev_is_space = c.is_whitespace();
    }
    line
}

/// Whether a line opens the main server block: `.:53 {`, `.:53{`, `. {`, with
/// any spacing, possibly among other keys (`.:53 , other:53 {`), possibly with
/// a trailing comment; a commented-out opener does not count.
fn opens_main_server_block(line: &str) -> bool {
    let Some(keys) = without_comment(line).trim().strip_suffix('{') else {
        return false;
    };
    keys.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|k| !k.is_empty())
        .any(|k| ROOT_KEYS.contains(&k))
}

/// Leading spaces and tabs of a line.
fn indentation(line: &str) -> &str {
    let body = line.trim_start_matches([' ', '\t']);
    &line[..line.len() - body.len()]
}

/// Returns `corefile` without the lines hairpin added, the rest byte for byte.
pub fn remove(corefile: &str) -> String {
    corefile
        .split_inclusive('\n')
        .filter(|l| !is_ours(l))
        .collect()
}

/// Returns `corefile` with exactly `rewrites` as hairpin's lines, placed directly
/// after the main server block's opening line at the block's own indentation,
/// each ending in [`MARKER`]. Lines hairpin added before are replaced; every
/// other byte is kept, so `remove(&apply(x, r)?) == x` for a Corefile `x` without
/// hairpin lines. Empty `rewrites` is [`remove`]. A Corefile over
/// [`MAX_COREFILE_BYTES`] is refused whole.
pub fn apply(corefile: &str, rewrites: &[Rewrite]) -> Result<String, CorefileError> {
    if corefile.len() > MAX_COREFILE_BYTES {
        return Err(CorefileError::TooLarge {
            len: corefile.len(),
        });
    }
    let base = remove(corefile);
    if rewrites.is_empty() {
        return Ok(base);
    }
    let lines: Vec<&str> = base.split_inclusive('\n').collect();
    let opener = lines
        .iter()
        .position(|l| opens_main_server_block(l))
        .ok_or(CorefileError::NoMainServerBlock)?;
    let opener_line = lines[opener];
    // Match the block's line endings, so a CRLF Corefile stays consistent.
    let eol = if opener_line.ends_with("\r\n") {
        "\r\n"
    } else if opener_line.ends_with('\n') {
        "\n"
    } else {
        return Err(CorefileError::UnterminatedServerBlock { line: opener + 1 });
    };
    let first_inside = lines[opener + 1..].iter().find(|l| !l.trim().is_empty());
    let indent = match first_inside {
        Some(l) if !l.trim_start().starts_with('}') => indentation(l).to_owned(),
        _ => format!("{}{DEFAULT_INDENT}", indentation(opener_line)),
    };
    let mut out = String::with_capacity(base.len() + rewrites.len() * 120);
    lines[..=opener].iter().for_each(|l| out.push_str(l));
    for directive in directives(rewrites) {
        out.push_str(&format!("{indent}{directive} {MARKER}{eol}"));
    }
    lines[opener + 1..].iter().for_each(|l| out.push_str(l));
    Ok(out)
}

/// The whole content of the [`IMPORT_KEY`] entry in `coredns-custom`: plugin
/// lines that the distribution's Corefile imports inside its main server block.
/// The key belongs to hairpin alone, so its lines carry no marker.
pub fn render_import(rewrites: &[Rewrite]) -> String {
    let mut out = String::from(
        "# Managed by hairpin: in-cluster names of PROXY-protocol LoadBalancers go to the relay.\n",
    );
    for directive in directives(rewrites) {
        out.push_str(&directive);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
