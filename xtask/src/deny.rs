//! `cargo xtask deny`: the supply-chain gate, cargo-deny against `deny.toml`.
//!
//! `bans`, `licenses` and `sources` read only Cargo.lock and the registry cache, so
//! they run offline and always gate. The cache must hold every crate of Cargo.lock
//! first, other platforms' too (cargo-deny runs `cargo metadata --offline`, and a
//! build downloads only the host's): [`fetch_locked`] does that, online, so the gate
//! passes from an empty cargo home as on a warm one. `advisories` needs the RustSec
//! advisory database, a git repository cargo-deny fetches: when it can be fetched the
//! check runs against it; when it cannot (no route to GitHub, as on the project's
//! build machines), against the dated snapshot kept in `supply-chain/`, and the run
//! says which database it read and how old it is. Either way a finding fails.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{prereqs, run, workspace_root};

/// The cargo-deny release installed into the cache (rust-version 1.88).
const CARGO_DENY_VERSION: &str = "0.20.2";

/// How long fetching the advisory database may take before it counts as unreachable.
const ADVISORY_FETCH_TIMEOUT: Duration = Duration::from_secs(90);

/// Returns cargo-deny, installing the pinned release into the cache first when missing
/// (`cargo install --locked`, a few minutes once).
pub(crate) fn ensure_cargo_deny() -> Result<PathBuf> {
    prereqs::ensure_cargo_tool("cargo-deny", CARGO_DENY_VERSION, "a few minutes", |o| {
        String::from_utf8_lossy(&o.stdout).contains(CARGO_DENY_VERSION)
    })
}

/// cargo-deny on every workspace member with the policy file `config`, Cargo.lock unchanged.
fn deny(bin: &Path, config: &Path) -> Command {
    let root = workspace_root();
    let mut cmd = Command::new(bin);
    cmd.current_dir(&root)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--config")
        .arg(config)
        .args(["--workspace", "--locked"]);
    cmd
}

/// Runs the gate: bans, licenses and sources offline (failing on any finding), then
/// advisories against the live RustSec database when it can be fetched, else
/// against the dated snapshot in `supply-chain/`, saying which and how old. Every
/// finding fails; nothing passes unchecked.
pub(crate) fn check() -> Result<()> {
    let bin = ensure_cargo_deny()?;
    fetch_locked()?;
    let policy = workspace_root().join("deny.toml");
    eprintln!("xtask: cargo-deny: bans, licenses, sources (deny.toml)");
    run(deny(&bin, &policy).args(["--offline", "check", "bans", "licenses", "sources"]))
        .context("cargo-deny refused the dependency graph (deny.toml): see its report above")?;
    match fetch_advisory_db(&bin, &policy)? {
        Fetched::Yes => {
            eprintln!("xtask: cargo-deny: advisories (the live RustSec database, just fetched)");
            run(deny(&bin, &policy).args(["--offline", "check", "advisories"]))
                .context("cargo-deny found advisories against Cargo.lock: see its report above")
        }
        Fetched::No(why) => {
            let snap = Snapshot::find()?;
            eprintln!(
                "xtask: cargo-deny: the live RustSec database could not be fetched ({why}); \
                 advisories against the snapshot of {} (commit {}, {})",
                snap.date,
                snap.commit,
                snap.age()
            );
            let config = snap.install(&policy)?;
            run(deny(&bin, &config).args(["--offline", "check", "advisories"])).with_context(|| {
                format!(
                    "cargo-deny found advisories against Cargo.lock in the RustSec snapshot of {}: \
                         see its report above",
                    snap.date
                )
            })
        }
    }
}

/// The directory name cargo-deny 0.20 derives from the default advisory URL
/// (`https://github.com/rustsec/advisory-db`): it looks for the database there under
/// `db-path`.
const ADVISORY_DB_DIR: &str = "advisory-db-3157b0e258782691";

/// A dated copy of the RustSec advisory database kept in the repository
/// (`supply-chain/rustsec-advisory-db-<YYYY-MM-DD>-<commit>.tar.xz`, `git archive` of
/// that commit), for machines that cannot reach GitHub. supply-chain/README.md says
/// how to refresh it.
struct Snapshot {
    archive: PathBuf,
    date: String,
    commit: String,
}

impl Snapshot {
    /// The one snapshot archive in `supply-chain/`.
    fn find() -> Result<Self> {
        let dir = workspace_root().join("supply-chain");
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("failed to read {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("rustsec-advisory-db-") && n.ends_with(".tar.xz")
                })
            })
            .collect();
        if found.len() != 1 {
            bail!(
                "expected exactly one rustsec-advisory-db-<YYYY-MM-DD>-<commit>.tar.xz in {}, found {}",
                dir.display(),
                found.len()
            );
        }
        let archive = found.remove(0);
        let name = archive
            .file_name()
            .and_then(|n| n.to_str())
            .expect("filtered on a UTF-8 name above");
        let (date, commit) = parse_snapshot_name(name).with_context(|| {
            format!("{name}: expected rustsec-advisory-db-<YYYY-MM-DD>-<commit>.tar.xz")
        })?;
        Ok(Self {
            archive,
            date,
            commit,
        })
    }

    /// How many days old the snapshot is, when `date` can tell.
    fn age_days(&self) -> Option<i64> {
        let secs = |args: &[&str]| {
            Command::new("date").args(args).output().ok().and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
        };
        let now = secs(&["-u", "+%s"])?;
        let then = secs(&["-u", "-d", &self.date, "+%s"])?;
        Some((now - then) / 86_400)
    }

    /// How many days old the snapshot is, in words.
    fn age(&self) -> String {
        match self.age_days() {
            Some(days) => format!("{days} days old"),
            None => "age unknown".to_owned(),
        }
    }

    /// Unpacks the snapshot as the git repository cargo-deny opens (once per
    /// archive, under the target directory) and returns a copy of `policy` that
    /// points `db-path` at it.
    fn install(&self, policy: &Path) -> Result<PathBuf> {
        let base = crate::target_dir()
            .join("advisory-db")
            .join(format!("{}-{}", self.date, self.commit));
        let repo = base.join(ADVISORY_DB_DIR);
        if !base.join(".ready").exists() {
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(&repo)
                .with_context(|| format!("failed to create {}", repo.display()))?;
            run(Command::new("tar")
                .arg("-xJf")
                .arg(&self.archive)
                .arg("-C")
                .arg(&repo))?;
            // cargo-deny reads the database through git: one commit, dated as the
            // snapshot, so its staleness check sees the snapshot's real age.
            let stamp = format!("{}T00:00:00Z", self.date);
            let git = |args: &[&str]| {
                let mut cmd = Command::new("git");
                cmd.current_dir(&repo)
                    .args([
                        "-c",
                        "user.name=hairpin",
                        "-c",
                        "user.email=hairpin@localhost",
                    ])
                    .args(args)
                    .env("GIT_AUTHOR_DATE", &stamp)
                    .env("GIT_COMMITTER_DATE", &stamp);
                cmd
            };
            run(&mut git(&["init", "-q"]))?;
            run(&mut git(&["add", "-A"]))?;
            run(&mut git(&[
                "commit",
                "-q",
                "-m",
                &format!("RustSec advisory-db {}", self.commit),
            ]))?;
            std::fs::write(base.join(".ready"), b"")
                .with_context(|| format!("failed to write {}", base.join(".ready").display()))?;
        }
        let text = std::fs::read_to_string(policy)
            .with_context(|| format!("failed to read {}", policy.display()))?;
        let db_path = format!("db-path = {:?}", base.display().to_string());
        let config = with_db_path(&text, &db_path).with_context(|| {
            format!(
                "{}: no [advisories] table to add db-path to",
                policy.display()
            )
        })?;
        let out = base.join("deny.toml");
        std::fs::write(&out, config)
            .with_context(|| format!("failed to write {}", out.display()))?;
        Ok(out)
    }
}

/// `rustsec-advisory-db-2026-08-21-bf5c0d2.tar.xz` -> ("2026-08-21", "bf5c0d2").
fn parse_snapshot_name(name: &str) -> Option<(String, String)> {
    let rest = name
        .strip_prefix("rustsec-advisory-db-")?
        .strip_suffix(".tar.xz")?;
    let (date, commit) = rest.rsplit_once('-')?;
    let ok_date = date.len() == 10
        && date.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    let ok_commit = !commit.is_empty() && commit.bytes().all(|b| b.is_ascii_hexdigit());
    (ok_date && ok_commit).then(|| (date.to_owned(), commit.to_owned()))
}

/// The policy text with `db_path` as the first key of its `[advisories]` table.
fn with_db_path(policy: &str, db_path: &str) -> Option<String> {
    let mut out = String::with_capacity(policy.len() + db_path.len() + 1);
    let mut added = false;
    for line in policy.lines() {
        out.push_str(line);
        out.push('\n');
        if !added && line.trim() == "[advisories]" {
            out.push_str(db_path);
            out.push('\n');
            added = true;
        }
    }
    added.then_some(out)
}

/// `cargo fetch --locked`: every crate Cargo.lock names, for every platform, into the
/// cargo home. Without it a cargo home warmed only by host builds fails the offline
/// check with `failed to download ... --offline was specified` (a Windows-only crate
/// such as `anstyle-wincon` is the first one missing).
fn fetch_locked() -> Result<()> {
    run(crate::cargo()
        .args(["fetch", "--locked", "--quiet", "--manifest-path"])
        .arg(workspace_root().join("Cargo.toml")))
    .context(
        "could not fetch the crates Cargo.lock names (cargo-deny reads them offline): \
         is crates.io reachable, and is Cargo.lock current?",
    )
}

/// Whether the advisory database was fetched.
enum Fetched {
    Yes,
    No(String),
}

/// `cargo-deny fetch db`, given [`ADVISORY_FETCH_TIMEOUT`]: a network that drops
/// packets would otherwise hang the run.
fn fetch_advisory_db(bin: &Path, policy: &Path) -> Result<Fetched> {
    let mut child = deny(bin, policy)
        .args(["fetch", "db"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start cargo-deny fetch")?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("waiting for cargo-deny fetch")? {
            if status.success() {
                return Ok(Fetched::Yes);
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            return Ok(Fetched::No(format!(
                "cargo-deny fetch: {status}: {}",
                last.trim()
            )));
        }
        if start.elapsed() > ADVISORY_FETCH_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Fetched::No(format!(
                "no answer within {} s",
                ADVISORY_FETCH_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The oldest the advisory snapshot may be: on machines without GitHub it is the
/// only advisory check, and a snapshot older than this misses a third of a year of
/// advisories. supply-chain/README.md says how to refresh it.
#[cfg(test)]
const MAX_SNAPSHOT_DAYS: i64 = 120;

#[cfg(test)]
mod tests {
    use super::{MAX_SNAPSHOT_DAYS, Snapshot, parse_snapshot_name, with_db_path};

    #[test]
    fn the_advisory_snapshot_is_at_most_120_days_old() {
        let snapshot = Snapshot::find().expect("the snapshot in supply-chain/");
        let days = snapshot.age_days().expect("date(1) tells the age");
        assert!(
            days <= MAX_SNAPSHOT_DAYS,
            "supply-chain/ holds the RustSec snapshot of {} (commit {}), {days} days old: \
             refresh it (supply-chain/README.md)",
            snapshot.date,
            snapshot.commit
        );
    }

    #[test]
    fn the_snapshot_name_gives_its_date_and_commit() {
        assert_eq!(
            parse_snapshot_name("rustsec-advisory-db-2026-08-21-bf5c0d2.tar.xz"),
            Some(("2026-08-21".to_owned(), "bf5c0d2".to_owned()))
        );
        assert_eq!(
            parse_snapshot_name("rustsec-advisory-db-2026-8-21-bf5c0d2.tar.xz"),
            None
        );
        assert_eq!(
            parse_snapshot_name("rustsec-advisory-db-2026-08-21-.tar.xz"),
            None
        );
        assert_eq!(
            parse_snapshot_name("advisory-db-2026-08-21-bf5c0d2.tar.xz"),
            None
        );
    }

    #[test]
    fn db_path_goes_into_the_advisories_table_only() {
        let policy = "[graph]\nx = 1\n\n[advisories]\nyanked = \"deny\"\n[bans]\n";
        let out = with_db_path(policy, "db-path = \"/d\"").expect("has [advisories]");
        assert_eq!(
            out,
            "[graph]\nx = 1\n\n[advisories]\ndb-path = \"/d\"\nyanked = \"deny\"\n[bans]\n"
        );
        assert_eq!(with_db_path("[bans]\n", "db-path = \"/d\""), None);
    }
}
