//! CoreDNS rewrites that send a LoadBalancer's hostnames to the hairpin relay's
//! ClusterIP Service, as text transformations of a Corefile (mode A) or as the
//! content of an import file in `coredns-custom` (mode B).
//!
//! Rewrite semantics, from the rewrite plugin's README and source
//! (coredns/coredns `plugin/rewrite/README.md` and `name.go`):
//! - `rewrite name exact FROM TO` always rewrites the answer back to FROM
//!   ("answers for rewrites of type `exact` are always rewritten"; `newExactNameRule`
//!   sets auto), in every CoreDNS release. We add no `answer` option to it: before
//!   `answer auto` existed (coredns/coredns#4473, first released in v1.8.4) an
//!   exact rule with options was a parse error that would stop CoreDNS loading.
//! - `rewrite name regex FROM TO answer auto` maps the rewritten question name in the
//!   answer back to whatever name the client asked (`responseRuleFor` with auto
//!   builds a remap from the rewritten name to the original). That is the only way
//!   to point a whole wildcard at one target and still answer with the name asked
//!   (coredns/coredns#2389), so wildcard rules need CoreDNS 1.8.4 or later: the
//!   writer reads the running version and holds them back below it
//!   (`k8s::coredns::version`).
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
    /// A `}` that closes no block: CoreDNS refuses such a Corefile, so nothing is
    /// added to it.
    #[error(
        "corefile: line {line}: '}}' closes no block (expected every '}}' to match an earlier '{{')"
    )]
    UnexpectedClose {
        /// 1-based line of the `}`.
        line: usize,
    },
    /// A `{` never closed: CoreDNS refuses such a Corefile ("expected '}'").
    #[error("corefile: block opened at line {line} is never closed (expected a matching '}}')")]
    UnclosedBlock {
        /// 1-based line of the innermost unclosed `{`.
        line: usize,
    },
    /// A quoted token that runs to the end of the file, swallowing every brace after it.
    #[error("corefile: quoted string opened at line {line} never ends (expected a closing '\"')")]
    UnterminatedQuote {
        /// 1-based line of the opening quote.
        line: usize,
    },
    /// The edited text failed the check run before anything is returned (a bug
    /// guard: it is never written).
    #[error("corefile: the edited Corefile failed validation: {reason}; nothing written")]
    InvalidEdit {
        /// What the check found.
        reason: String,
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

/// One token as CoreDNS's Corefile lexer reads it (coredns/caddy
/// `caddyfile/lexer.go`, the parser every CoreDNS release uses).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    /// Its text, quotes removed and `\"` unescaped, as the parser compares it.
    text: String,
    /// 0-based line it starts on (lines end at `\n`).
    line: usize,
    /// Whether it was a quoted string (which may span lines).
    quoted: bool,
}

/// The lexer's reading of a Corefile, and whether a quoted string ran to the end.
struct Lexed {
    tokens: Vec<Token>,
    /// 0-based line of a quote never closed.
    open_quote: Option<usize>,
}

/// Splits a Corefile into tokens exactly as CoreDNS's lexer does: tokens are
/// separated by Unicode whitespace; a `"` at the start of a token opens a quoted
/// string that may span lines and ends at the next unescaped `"` (only `\"` is an
/// escape); outside quotes a `#` anywhere, even inside a word, starts a comment
/// running to the end of the line; `\r` is dropped; a leading byte order mark is
/// skipped. Braces are not special to the lexer: the parser takes a token whose
/// text is `{` or `}` as a brace, quoted or not.
fn lex(corefile: &str) -> Lexed {
    let mut tokens = Vec::new();
    let mut val = String::new();
    let (mut line, mut start_line) = (0, 0);
    let (mut comment, mut quoted, mut escaped, mut was_quoted) = (false, false, false, false);
    let text = corefile.strip_prefix('\u{feff}').unwrap_or(corefile);
    let mut emit = |val: &mut String, start_line: usize, was_quoted: &mut bool| {
        tokens.push(Token {
            text: std::mem::take(val),
            line: start_line,
            quoted: std::mem::take(was_quoted),
        });
    };
    for ch in text.chars() {
        if quoted {
            if !escaped && ch == '\\' {
                escaped = true;
                continue;
            }
            if !escaped && ch == '"' {
                quoted = false;
                emit(&mut val, start_line, &mut was_quoted);
                continue;
            }
            if ch == '\n' {
                line += 1;
            }
            if escaped && ch != '"' {
                val.push('\\');
            }
            val.push(ch);
            escaped = false;
            continue;
        }
        if ch.is_whitespace() {
            if ch == '\r' {
                continue;
            }
            if ch == '\n' {
                line += 1;
                comment = false;
            }
            if !val.is_empty() {
                emit(&mut val, start_line, &mut was_quoted);
            }
            continue;
        }
        if ch == '#' {
            comment = true;
        }
        if comment {
            continue;
        }
        if val.is_empty() {
            start_line = line;
            if ch == '"' {
                quoted = true;
                was_quoted = true;
                continue;
            }
        }
        val.push(ch);
    }
    if quoted {
        return Lexed {
            tokens,
            open_quote: Some(start_line),
        };
    }
    if !val.is_empty() {
        emit(&mut val, start_line, &mut was_quoted);
    }
    Lexed {
        tokens,
        open_quote: None,
    }
}

/// A line's place in the block structure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LineInfo {
    /// Brace depth before the line's first token (0: between server blocks).
    depth: usize,
    /// The line begins inside a quoted string opened on an earlier line.
    in_quote: bool,
    /// The line opens a server block holding the root zone: it starts at depth 0,
    /// its last token opens a block and is its only brace, and a key before that on
    /// the line is a root key.
    opens_root_block: bool,
}

/// Whether token `i` opens a block: a `{` token, or (a spelling this editor has
/// always accepted, `.:53{`) an unquoted word ending in `{` that is the last
/// token on its line.
fn is_open(tokens: &[Token], i: usize) -> bool {
    let t = &tokens[i];
    t.text == "{"
        || (!t.quoted
            && t.text.len() > 1
            && t.text.ends_with('{')
            && tokens.get(i + 1).is_none_or(|n| n.line != t.line))
}

/// The block structure of a Corefile, line by line, and the first reason CoreDNS
/// would refuse it, if any: a quote never closed, a `}` closing nothing, a `{`
/// never closed. The lines are read on past a stray `}` (at depth 0).
fn structure(corefile: &str) -> (Vec<LineInfo>, Option<CorefileError>) {
    let lexed = lex(corefile);
    let mut error = lexed
        .open_quote
        .map(|line| CorefileError::UnterminatedQuote { line: line + 1 });
    let tokens = &lexed.tokens;
    let mut info = vec![LineInfo::default(); corefile.split_inclusive('\n').count().max(1)];
    // Lines that begin inside a quoted token spanning lines.
    for t in tokens.iter().filter(|t| t.quoted) {
        let span = t.text.matches('\n').count();
        for l in t.line + 1..=t.line + span {
            if let Some(li) = info.get_mut(l) {
                li.in_quote = true;
            }
        }
    }
    // 0-based lines of the braces still open.
    let mut open: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let line = tokens[i].line;
        let end = tokens[i..]
            .iter()
            .position(|t| t.line != line)
            .map_or(tokens.len(), |n| i + n);
        let on_line = &tokens[i..end];
        // Only a line whose one brace is its last token: after `. { errors } x {` the
        // next line is at depth 2, not in the server block's body.
        let opens_root_block = open.is_empty()
            && is_open(tokens, end - 1)
            && on_line[..on_line.len() - 1]
                .iter()
                .all(|t| t.text != "{" && t.text != "}")
            && {
                let last = &on_line[on_line.len() - 1];
                let glued = (last.text != "{").then(|| &last.text[..last.text.len() - 1]);
                on_line[..on_line.len() - 1]
                    .iter()
                    .map(|t| t.text.as_str())
                    .chain(glued)
                    .flat_map(|k| k.split(','))
                    .any(|k| ROOT_KEYS.contains(&k))
            };
        if let Some(li) = info.get_mut(line) {
            li.depth = open.len();
            li.opens_root_block = opens_root_block;
        }
        for j in i..end {
            if is_open(tokens, j) {
                open.push(tokens[j].line);
            } else if tokens[j].text == "}" && open.pop().is_none() && error.is_none() {
                error = Some(CorefileError::UnexpectedClose {
                    line: tokens[j].line + 1,
                });
            }
        }
        i = end;
    }
    if let (None, Some(line)) = (&error, open.last()) {
        error = Some(CorefileError::UnclosedBlock { line: line + 1 });
    }
    (info, error)
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
///
/// The main server block is the first block opened at brace depth 0 whose keys
/// hold the root zone (`.:53 {`, `. {`), found by reading the text as CoreDNS's
/// lexer does (comments, quoted strings), so a plugin block such as
/// `forward . 10.150.0.1 {` inside another server block never counts. A Corefile
/// CoreDNS would refuse (a `}` closing nothing, a block or a quote never closed)
/// is refused, and the result is checked before it is returned (`validate`):
/// balanced, ours at depth 1 right after one root block's opening line, nothing
/// else changed. Removing (empty `rewrites`, [`remove`]) is not checked: it only
/// takes out lines hairpin added, wherever an earlier version put them.
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
    let (info, refused) = structure(&base);
    let lines: Vec<&str> = base.split_inclusive('\n').collect();
    let opener = (0..lines.len()).find(|&i| info[i].opens_root_block && !info[i].in_quote);
    // Match the block's line endings, so a CRLF Corefile stays consistent.
    let eol = match opener.map(|o| lines[o]) {
        Some(l) if l.ends_with("\r\n") => "\r\n",
        Some(l) if l.ends_with('\n') => "\n",
        // An opener cut off before its newline (a truncated edit).
        Some(_) => {
            return Err(CorefileError::UnterminatedServerBlock {
                line: opener.map_or(0, |o| o + 1),
            });
        }
        None => "\n",
    };
    if let Some(e) = refused {
        return Err(e);
    }
    let opener = opener.ok_or(CorefileError::NoMainServerBlock)?;
    let opener_line = lines[opener];
    let first_inside = lines[opener + 1..].iter().find(|l| !l.trim().is_empty());
    let indent = match first_inside {
        Some(l) if !l.trim_start().starts_with('}') => indentation(l).to_owned(),
        _ => format!("{}{DEFAULT_INDENT}", indentation(opener_line)),
    };
    let directives = directives(rewrites);
    let mut out = String::with_capacity(base.len() + rewrites.len() * 120);
    lines[..=opener].iter().for_each(|l| out.push_str(l));
    for directive in &directives {
        out.push_str(&format!("{indent}{directive} {MARKER}{eol}"));
    }
    lines[opener + 1..].iter().for_each(|l| out.push_str(l));
    validate(&base, &out, directives.len())?;
    Ok(out)
}

/// Checks an edited Corefile before it leaves this module: it reads as balanced
/// (no quote left open, every `}` matching a `{`); its marked lines are exactly
/// `count` contiguous `rewrite name ...` directives at depth 1, right after the
/// opening line of a server block holding the root zone; and removing them gives
/// `base` back byte for byte.
fn validate(base: &str, out: &str, count: usize) -> Result<(), CorefileError> {
    let invalid = |reason: String| CorefileError::InvalidEdit { reason };
    let (info, refused) = structure(out);
    if let Some(e) = refused {
        return Err(invalid(e.to_string()));
    }
    if remove(out) != base {
        return Err(invalid(
            "removing the marked lines does not give the input back".into(),
        ));
    }
    let lines: Vec<&str> = out.split_inclusive('\n').collect();
    let ours: Vec<usize> = (0..lines.len()).filter(|&i| is_ours(lines[i])).collect();
    let (Some(&first), Some(&last)) = (ours.first(), ours.last()) else {
        return Err(invalid("expected marked lines, found none".into()));
    };
    if ours.len() != count || last - first + 1 != count {
        return Err(invalid(format!(
            "expected {count} contiguous marked lines, found {} between lines {} and {}",
            ours.len(),
            first + 1,
            last + 1
        )));
    }
    let after_root_opener = first
        .checked_sub(1)
        .is_some_and(|o| info[o].opens_root_block && !info[o].in_quote);
    if !after_root_opener {
        return Err(invalid(format!(
            "line {}: expected the marked lines right after a root server block's opening line",
            first + 1
        )));
    }
    for &i in &ours {
        let tokens = lex(lines[i]).tokens;
        let words: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        if info[i].depth != 1
            || info[i].in_quote
            || words.get(..2) != Some(&["rewrite", "name"][..])
            || tokens
                .iter()
                .any(|t| t.quoted || t.text.contains(['{', '}']))
        {
            return Err(invalid(format!(
                "line {}: expected a `rewrite name` directive at depth 1, found {:?} at depth {}",
                i + 1,
                lines[i].trim_end(),
                info[i].depth
            )));
        }
    }
    Ok(())
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

/// Not for the agent: the property tests' and the fuzz target's oracle.
#[cfg(any(test, feature = "testing"))]
mod reference;
#[cfg(any(test, feature = "testing"))]
pub use reference::reference_depths;

#[cfg(test)]
mod tests;
