//! `hairpin-agent cleanup`: removes everything hairpin ever wrote on this node and,
//! when the API is reachable, in the cluster: the /etc/hosts block, the names
//! address on its link, the CoreDNS lines (or the import key) and the Lease.
//! Idempotent: what is already gone is reported as absent, not as an error.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::DeleteParams};
use serde::Serialize;

use super::{CliError, OutputFormat, print_json, print_text};
use crate::{
    k8s::{
        self,
        coredns::{ClusterCleanup, ObjectName, Written},
    },
    names::hosts_writer,
    names::link as names_link,
};

/// Options of `cleanup`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Removes everything hairpin wrote: the managed block of the hosts file \
(every other byte kept), the names address on --names-link (and the dummy link when hairpin \
made it), hairpin's rewrite lines in the CoreDNS Corefile or its key in coredns-custom, and \
the agent's Lease, the names ports' nftables table (`table ip hairpin`, `table ip6 hairpin`), \
and the kernel path's pinned datapath in --bpf-pin-dir. Run it after \
removing the DaemonSet. Steps that need the API are skipped \
with a note when no API server is reachable.",
    after_help = "Exit status: 0 everything that existed was removed (or nothing was there); \
1 something could not be removed.\n\nExamples:\n  hairpin-agent cleanup --hosts-file /etc/hosts \
--names-link hairpin0 --names-address 169.254.20.11\n  hairpin-agent cleanup --coredns corefile --output json"
)]
pub struct CleanupArgs {
    /// Hosts file whose managed block to remove. Unset: not touched.
    #[arg(long, env = "HAIRPIN_HOSTS_FILE")]
    pub hosts_file: Option<PathBuf>,

    /// Link the names address was put on.
    #[arg(long, env = "HAIRPIN_NAMES_LINK", requires = "names_address")]
    pub names_link: Option<String>,

    /// The names address to remove from --names-link.
    #[arg(long, env = "HAIRPIN_NAMES_ADDRESS")]
    pub names_address: Option<IpAddr>,

    /// `off`: the names ports' nftables table is not touched (the agent, run with
    /// `off`, writes none).
    #[arg(long, env = "HAIRPIN_NAMES_REDIRECT", value_enum,
          default_value_t = crate::agent::args::NamesRedirect::Auto)]
    pub names_redirect: crate::agent::args::NamesRedirect,

    /// Link the relays' listen addresses were put on (`run --listen-link`); `none`:
    /// not touched.
    #[arg(long, env = "HAIRPIN_LISTEN_LINK", default_value = crate::agent::args::DEFAULT_LISTEN_LINK)]
    pub listen_link: String,

    /// The listen addresses to remove from --listen-link. Default: the agent's
    /// defaults (169.254.104.1, fd68:6169:7270:696e::1).
    #[arg(
        long = "listen-address",
        env = "HAIRPIN_LISTEN_ADDRESSES",
        value_delimiter = ','
    )]
    pub listen_addresses: Vec<IpAddr>,

    /// The API, and the CoreDNS writing to undo.
    #[command(flatten)]
    pub cluster: ClusterCleanup,

    /// The agent's Lease, `namespace/name`, to delete.
    #[arg(
        long,
        env = "HAIRPIN_LEASE",
        default_value = "hairpin-system/hairpin-agent"
    )]
    pub lease: ObjectName,

    /// Where the kernel path pinned its sockets maps (`run --bpf-pin-dir`); every pin
    /// there is removed, and the directory when left empty. `none`: not touched.
    #[arg(long, env = "HAIRPIN_BPF_PIN_DIR", default_value = crate::agent::args::DEFAULT_BPF_PIN_DIR)]
    pub bpf_pin_dir: PathBuf,

    /// How long to wait for an exiting agent to release the pin directory's lock.
    /// An agent still holding it after that owns the datapath: the pins are left
    /// alone and the step fails (stop the agent first).
    #[arg(long, env = "HAIRPIN_PIN_LOCK_WAIT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub pin_lock_wait: std::time::Duration,

    /// What to clean: `node` (the hosts block and the names address, run on every
    /// node), `cluster` (CoreDNS lines and the Lease, run once), or `all`.
    #[arg(long, env = "HAIRPIN_CLEANUP_SCOPE", value_enum, default_value_t = Scope::All)]
    pub scope: Scope,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `cleanup --scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    /// This node's files and addresses only.
    Node,
    /// The cluster-wide objects only (CoreDNS lines or key, the Lease).
    Cluster,
    /// Both.
    All,
}

/// What happened to one thing hairpin may have written.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    /// It was there and is gone now.
    Removed,
    /// It was not there.
    Absent,
    /// Not attempted (not configured, or no API).
    Skipped,
    /// Removing it failed.
    Failed,
}

/// One step of the cleanup report: what was removed, and how it went.
#[derive(Debug, Serialize)]
pub(crate) struct CleanupStep {
    /// `hosts`, `names-address`, `names-nat`, `coredns`, `lease`, `pinned-*`.
    pub name: &'static str,
    /// The thing: a path, `addr on link`, `configmap ns/name`, `lease ns/name`.
    pub object: String,
    /// What happened.
    pub outcome: Outcome,
    /// Detail: the error, or why it was skipped.
    pub detail: Option<String>,
}

/// The JSON document `cleanup --output json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct CleanupReport {
    /// True when nothing failed.
    pub ok: bool,
    /// Each step in order.
    pub steps: Vec<CleanupStep>,
}

/// Whether one of `steps` failed.
pub(super) fn failed(steps: &[CleanupStep]) -> bool {
    steps.iter().any(|s| s.outcome == Outcome::Failed)
}

/// The report of `steps`: ok when none failed.
pub(super) fn report(steps: Vec<CleanupStep>) -> CleanupReport {
    CleanupReport {
        ok: !failed(&steps),
        steps,
    }
}

/// One step's result.
pub(super) fn step(
    name: &'static str,
    object: String,
    outcome: Outcome,
    detail: Option<String>,
) -> CleanupStep {
    CleanupStep {
        name,
        object,
        outcome,
        detail,
    }
}

/// Removes everything hairpin wrote and reports each removal; returns the exit code.
pub fn clean_up(args: &CleanupArgs) -> Result<i32, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(remove_all(args));
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&render(&report))?,
    }
    Ok(if report.ok { 0 } else { 1 })
}

/// Does every step and reports each.
pub(crate) async fn remove_all(args: &CleanupArgs) -> CleanupReport {
    let mut steps = Vec::new();
    if args.scope != Scope::Cluster {
        node_steps(args, &mut steps).await;
    }
    if args.scope != Scope::Node {
        cluster_steps(args, &mut steps).await;
    }
    report(steps)
}

async fn node_steps(args: &CleanupArgs, steps: &mut Vec<CleanupStep>) {
    if let Some(path) = &args.hosts_file {
        let object = path.display().to_string();
        steps.push(match hosts_writer::cleanup(path) {
            Ok(true) => step("hosts", object, Outcome::Removed, None),
            Ok(false) => step("hosts", object, Outcome::Absent, None),
            Err(e) => step("hosts", object, Outcome::Failed, Some(e.to_string())),
        });
    }
    if args.listen_link != "none" && !args.listen_link.is_empty() {
        let addresses = if args.listen_addresses.is_empty() {
            crate::agent::args::default_listen_addresses().collect()
        } else {
            args.listen_addresses.clone()
        };
        for address in addresses {
            steps.push(remove_address("listen-address", &args.listen_link, address).await);
        }
    }
    if let (Some(link), Some(address)) = (&args.names_link, args.names_address) {
        steps.push(remove_address("names-address", link, address).await);
    }
    // The names ports' nftables table (`--names-redirect auto` without programs),
    // in both families: it names no address, so none needs to be given.
    let tables = match args.names_redirect {
        crate::agent::args::NamesRedirect::Off => Vec::new(),
        crate::agent::args::NamesRedirect::Auto => vec![
            ("ip", IpAddr::from([0u8; 4])),
            ("ip6", IpAddr::from([0u16; 8])),
        ],
    };
    for (family, of) in tables {
        let object = format!("table {family} {}", crate::names::nat::TABLE);
        steps.push(match crate::names::nat::remove(of) {
            Ok(true) => step("names-nat", object, Outcome::Removed, None),
            Ok(false) => step("names-nat", object, Outcome::Absent, None),
            Err(e) => step("names-nat", object, Outcome::Failed, Some(e.to_string())),
        });
    }
    if args.bpf_pin_dir.as_os_str() != "none" {
        remove_pins(&args.bpf_pin_dir, args.pin_lock_wait, steps);
    }
}

/// Removes the datapath pinned in `dir`, whatever happened to its agent: every link
/// detached (the programs stop at once: traffic goes as before hairpin), then every
/// pin (links, programs, maps, the layout directories, and the sockets maps earlier
/// releases pinned), then `dir` itself when nothing else is in it.
fn remove_pins(dir: &Path, wait: std::time::Duration, steps: &mut Vec<CleanupStep>) {
    let object = dir.display().to_string();
    if std::fs::symlink_metadata(dir).is_err() {
        steps.push(step("pinned-maps", object, Outcome::Absent, None));
        return;
    }
    // The pin directory's own lock, as an agent takes it: never under a live
    // agent (one that is exiting has `wait`), never through a symlink, never off
    // a bpf filesystem.
    let _lock = match crate::datapath::pin::lock_for_cleanup(dir, wait) {
        Ok(lock) => lock,
        Err(e) => {
            steps.push(step(
                "pinned-maps",
                object,
                Outcome::Failed,
                Some(e.to_string()),
            ));
            return;
        }
    };
    remove_locked_pins(dir, steps);
}

/// [`remove_pins`] once the directory is checked and locked.
fn remove_locked_pins(dir: &Path, steps: &mut Vec<CleanupStep>) {
    let object = dir.display().to_string();
    for r in crate::datapath::pin::remove_all(dir) {
        let what = match r.kind {
            "link" => "pinned-link",
            "program" => "pinned-program",
            "map" => "pinned-map",
            _ => "pinned-layout",
        };
        let object = r.path.display().to_string();
        steps.push(match r.result {
            Ok(()) => step(what, object, Outcome::Removed, None),
            Err(e) => step(what, object, Outcome::Failed, Some(e.to_string())),
        });
    }
    // Only an empty directory goes: anything else in it is not ours.
    steps.push(match std::fs::remove_dir(dir) {
        Ok(()) => step("pinned-maps", object, Outcome::Removed, None),
        // The uninstall mounts the directory itself from the host: it stays there.
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EBUSY as i32) => step(
            "pinned-maps",
            object,
            Outcome::Skipped,
            Some("directory kept: it is a mount point".into()),
        ),
        Err(e) => step(
            "pinned-maps",
            object,
            Outcome::Skipped,
            Some(format!("directory kept: {e}")),
        ),
    });
}

/// Removes `address` from `link` (deleting the dummy link when it is left empty).
async fn remove_address(what: &'static str, link: &str, address: IpAddr) -> CleanupStep {
    let object = format!("{address} on {link}");
    {
        match names_link::remove(link, address).await {
            Ok(r) if r.address_from.is_empty() && r.deleted_link.is_none() => {
                step(what, object, Outcome::Absent, None)
            }
            Ok(r) => {
                let mut detail = format!("removed from {}", r.address_from.join(", "));
                if let Some(l) = r.deleted_link {
                    detail.push_str(&format!("; deleted dummy link {l}"));
                }
                step(what, object, Outcome::Removed, Some(detail))
            }
            Err(e) => step(what, object, Outcome::Failed, Some(e.to_string())),
        }
    }
}

async fn cluster_steps(args: &CleanupArgs, steps: &mut Vec<CleanupStep>) {
    let coredns = args.cluster.coredns.config();
    let cm_object = coredns
        .as_ref()
        .map(|c| format!("configmap {}", c.written()));
    let lease_object = format!("lease {}", args.lease);
    let client = match k8s::client::client(args.cluster.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            let note = Some(format!("no Kubernetes API reachable: {e}"));
            if let Some(o) = cm_object {
                steps.push(step("coredns", o, Outcome::Skipped, note.clone()));
            }
            steps.push(step("lease", lease_object, Outcome::Skipped, note));
            return;
        }
    };
    if let (Some(cfg), Some(object)) = (coredns, cm_object) {
        steps.push(match k8s::coredns::remove(&client, &cfg).await {
            Ok(Written::Unchanged) => step("coredns", object, Outcome::Absent, None),
            Ok(_) => step("coredns", object, Outcome::Removed, None),
            Err(e) => step("coredns", object, Outcome::Failed, Some(e.to_string())),
        });
    }
    let leases: Api<Lease> = Api::namespaced(client, &args.lease.namespace);
    steps.push(
        match leases
            .delete(&args.lease.name, &DeleteParams::default())
            .await
        {
            Ok(_) => step("lease", lease_object, Outcome::Removed, None),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                step("lease", lease_object, Outcome::Absent, None)
            }
            Err(e) => step("lease", lease_object, Outcome::Failed, Some(e.to_string())),
        },
    );
}

/// The human rendering.
pub(crate) fn render(r: &CleanupReport) -> String {
    let mut out = String::new();
    for s in &r.steps {
        let outcome = format!("{:?}", s.outcome).to_lowercase();
        out.push_str(&format!("{:<14} {:<8} {}", s.name, outcome, s.object));
        if let Some(d) = &s.detail {
            out.push_str(&format!(": {d}"));
        }
        out.push('\n');
    }
    if r.steps.is_empty() {
        out.push_str(
            "nothing to clean: pass --hosts-file, --names-link/--names-address or --coredns\n",
        );
    }
    out.push_str(if r.ok {
        "cleanup complete\n"
    } else {
        "cleanup incomplete: see the failed steps\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CleanupArgs,
    }

    fn args(extra: &[&str]) -> CleanupArgs {
        let mut argv = vec!["cleanup", "--kubeconfig", "/nonexistent/kubeconfig"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    #[tokio::test]
    async fn scope_node_touches_only_the_node_and_scope_cluster_only_the_cluster() {
        let dir = std::env::temp_dir().join(format!("hairpin-cleanup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let hosts = dir.join("hosts");
        let block = "127.0.0.1 localhost\n# BEGIN hairpin managed block (do not edit)\n192.0.2.1\ta.example.com\n# END hairpin managed block";
        let path = hosts.to_str().expect("utf-8");

        std::fs::write(&hosts, block).expect("write");
        let cluster = remove_all(&args(&["--hosts-file", path, "--scope", "cluster"])).await;
        let names: Vec<&str> = cluster.steps.iter().map(|s| s.name).collect();
        assert_eq!(names, ["lease"], "{:?}", cluster.steps);
        assert_eq!(std::fs::read_to_string(&hosts).expect("read"), block);

        // `--listen-link none`, `--bpf-pin-dir none`, `--names-redirect off`: this
        // test must not touch the machine's own links, pins or nftables.
        let node = remove_all(&args(&[
            "--hosts-file",
            path,
            "--scope",
            "node",
            "--listen-link",
            "none",
            "--bpf-pin-dir",
            "none",
            "--names-redirect",
            "off",
        ]))
        .await;
        let names: Vec<&str> = node.steps.iter().map(|s| s.name).collect();
        assert_eq!(names, ["hosts"], "{:?}", node.steps);
        assert_eq!(node.steps[0].outcome, Outcome::Removed);
        assert_eq!(
            std::fs::read_to_string(&hosts).expect("read"),
            "127.0.0.1 localhost"
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            args(&[]).listen_link,
            "hairpin0",
            "by default the node scope removes the relays' listen addresses from hairpin0"
        );
    }

    #[test]
    fn every_pinned_map_goes_and_the_directory_only_when_nothing_else_is_in_it() {
        let dir = std::env::temp_dir().join(format!("hairpin-pins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for f in ["sockets-7", "sockets-12", "not-ours"] {
            std::fs::write(dir.join(f), "").expect("file");
        }
        let mut steps = Vec::new();
        remove_locked_pins(&dir, &mut steps);
        let got: Vec<(&str, &Outcome)> = steps.iter().map(|s| (s.name, &s.outcome)).collect();
        assert_eq!(
            got,
            [
                ("pinned-map", &Outcome::Removed),
                ("pinned-map", &Outcome::Removed),
                ("pinned-maps", &Outcome::Skipped),
            ],
            "{steps:?}"
        );
        assert!(dir.join("not-ours").exists());
        assert!(!dir.join("sockets-7").exists() && !dir.join("sockets-12").exists());

        std::fs::remove_file(dir.join("not-ours")).expect("rm");
        std::fs::write(dir.join("sockets-3"), "").expect("file");
        let mut steps = Vec::new();
        remove_locked_pins(&dir, &mut steps);
        assert_eq!(steps.last().map(|s| &s.outcome), Some(&Outcome::Removed));
        assert!(!dir.exists());

        let mut steps = Vec::new();
        remove_pins(&dir, Duration::ZERO, &mut steps);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].outcome, Outcome::Absent);
    }

    /// Issue 31: cleanup never follows a symlinked pin directory, nor works on one
    /// off bpffs (the privileged suite checks the lock against a live agent).
    #[test]
    fn a_symlinked_or_foreign_pin_directory_is_refused_and_left_as_it_is() {
        let base = tempfile::tempdir().expect("tempdir");
        let target = base.path().join("elsewhere");
        std::fs::create_dir_all(target.join("v1/maps")).expect("dirs");
        std::fs::write(target.join("v1/maps/precious"), "").expect("file");
        let link = base.path().join("pins");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let mut steps = Vec::new();
        remove_pins(&link, Duration::ZERO, &mut steps);
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].outcome, Outcome::Failed);
        assert!(
            steps[0]
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("symbolic link")),
            "{steps:?}"
        );
        assert!(target.join("v1/maps/precious").exists());
        // A real directory, but not on a bpf filesystem.
        let mut steps = Vec::new();
        remove_pins(&target, Duration::ZERO, &mut steps);
        assert_eq!(steps[0].outcome, Outcome::Failed);
        assert!(
            steps[0]
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("bpf filesystem")),
            "{steps:?}"
        );
        assert!(target.join("v1/maps/precious").exists());
    }
}
