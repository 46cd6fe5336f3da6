//! The real Kubernetes components the `real_cluster` suite runs, built from source
//! through the Go module proxy: kube-apiserver, kube-controller-manager and
//! kube-proxy (one multi-call binary), the kubelet, etcd and CoreDNS, and the pause
//! binary of the kubelet's pod sandboxes (upstream's C source, linked statically);
//! and the Gateway API's CRDs.
//! Each is a small Go module
//! of ours under `xtask/k8s/` whose go.mod and go.sum pin every dependency; the
//! build runs with `-mod=readonly`, so a pin that does not match the sums fails
//! instead of being rewritten.
//!
//! Binaries are cached under `<cache>/k8s/<component>-<version>-<go version>-<pin
//! hash>/`: a second run builds nothing. `HAIRPIN_K8S_VERSION` picks another
//! Kubernetes release with a committed pin (`xtask/k8s/kubernetes/versions/`).

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cache, run, workspace_root};

/// The Kubernetes release built unless `HAIRPIN_K8S_VERSION` names another.
pub(crate) const DEFAULT_K8S_VERSION: &str = "v1.37.2";
/// The etcd release `xtask/k8s/etcd/go.mod` pins.
pub(crate) const ETCD_VERSION: &str = "v3.6.16";
/// The CoreDNS release `xtask/k8s/coredns/go.mod` pins.
pub(crate) const COREDNS_VERSION: &str = "v1.14.7";
/// The pause image's release as `build/pause/Makefile` of [`DEFAULT_K8S_VERSION`]
/// tags it (the binary's `-v` prints it).
pub(crate) const PAUSE_VERSION: &str = "3.10.2";
/// The Gateway API release `xtask/k8s/gateway-api/go.mod` pins (its CRDs).
pub(crate) const GATEWAY_API_VERSION: &str = "v1.6.3";

/// The variables `cargo xtask test` hands the suites, one per binary.
const KUBE_BINARIES: [(&str, &str); 3] = [
    ("kube-apiserver", "HAIRPIN_KUBE_APISERVER_BIN"),
    (
        "kube-controller-manager",
        "HAIRPIN_KUBE_CONTROLLER_MANAGER_BIN",
    ),
    ("kube-proxy", "HAIRPIN_KUBE_PROXY_BIN"),
];

/// The node's components (xtask/k8s/kubelet) and their variables.
const NODE_BINARIES: [(&str, &str); 2] = [
    ("kubelet", "HAIRPIN_KUBELET_BIN"),
    ("kube-scheduler", "HAIRPIN_KUBE_SCHEDULER_BIN"),
];

/// Options of `cargo xtask k8s`.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct Options {
    /// Write a pin for another served Kubernetes release (go.mod and go.sum under
    /// xtask/k8s/kubernetes/versions/, resolved through the module proxy), then stop.
    #[arg(long, value_name = "VERSION", env = "HAIRPIN_K8S_PIN")]
    pub(crate) pin: Option<String>,
}

/// `cargo xtask k8s`: builds (or finds cached) every component and prints where.
pub(crate) fn command(opts: &Options) -> Result<()> {
    if let Some(version) = &opts.pin {
        return pin(version);
    }
    for (var, path) in ensure_components()? {
        println!("{var}={}", path.display());
    }
    Ok(())
}

/// Builds what is not cached; returns `(variable, binary)` for each binary.
pub(crate) fn ensure_components() -> Result<Vec<(&'static str, PathBuf)>> {
    let go = Go::find()?;
    let version = k8s_version();
    let mut out = Vec::new();
    let kube = build_kube(&go, &version)?;
    for (name, var) in KUBE_BINARIES {
        out.push((var, kube.join(name)));
    }
    let etcd = build_tool(
        &go,
        "etcd",
        ETCD_VERSION,
        "go.etcd.io/etcd/server/v3",
        &["--version"],
    )?;
    out.push(("HAIRPIN_ETCD_BIN", etcd));
    let coredns = build_tool(
        &go,
        "coredns",
        COREDNS_VERSION,
        "github.com/coredns/coredns",
        &["-version"],
    )?;
    out.push(("HAIRPIN_COREDNS_BIN", coredns));
    // The kubelet's module pins the default release only: another release's suite
    // runs without it (the kubelet scenarios say so and skip).
    if version == DEFAULT_K8S_VERSION {
        let node = build_node(&go, &version)?;
        for (name, var) in NODE_BINARIES {
            out.push((var, node.join(name)));
        }
        out.push(("HAIRPIN_PAUSE_BIN", build_pause(&go, &version)?));
    }
    out.push(("HAIRPIN_GATEWAY_API_CRDS", gateway_api_crds(&go)?));
    Ok(out)
}

/// The Gateway API's standard-channel CRDs (the module's `config/crd/standard`),
/// fetched through the module proxy and checked against the committed go.sum;
/// returns the directory holding them.
fn gateway_api_crds(go: &Go) -> Result<PathBuf> {
    let module = modules_dir().join("gateway-api");
    let hash = pin_hash(&[module.join("go.mod"), module.join("go.sum")])?;
    let (dir, cached) = cache_entry(
        &format!("gateway-api-{GATEWAY_API_VERSION}-{hash}"),
        &["gateway.networking.k8s.io_httproutes.yaml"],
    );
    if cached {
        eprintln!(
            "xtask: Gateway API {GATEWAY_API_VERSION} CRDs cached in {}",
            dir.display()
        );
        return Ok(dir);
    }
    build_into(
        &dir,
        &format!("Gateway API {GATEWAY_API_VERSION} CRDs"),
        |tmp| {
            let info = go.mod_download(&module, "sigs.k8s.io/gateway-api")?;
            let src = Path::new(
                info["Dir"]
                    .as_str()
                    .context("`go mod download` gave no Dir")?,
            )
            .join("config/crd/standard");
            for e in fs::read_dir(&src).with_context(|| format!("read {}", src.display()))? {
                let path = e?.path();
                let name = path.file_name().context("a file name")?;
                if path.extension().is_some_and(|x| x == "yaml")
                    && name
                        .to_string_lossy()
                        .starts_with("gateway.networking.k8s.io_")
                {
                    fs::copy(&path, tmp.join(name))
                        .with_context(|| format!("copy {}", path.display()))?;
                }
            }
            Ok(())
        },
    )?;
    Ok(dir)
}

/// The kubelet and kube-scheduler (which binds the DaemonSet's pods): one
/// multi-call binary (`node`) with a link per component, from a module of its own
/// (`xtask/k8s/kubelet`, the same release and replaces as `xtask/k8s/kubernetes`),
/// so that their extra dependencies leave the other components' pin and cache entry
/// as they are. Returns the directory.
fn build_node(go: &Go, version: &str) -> Result<PathBuf> {
    let module = modules_dir().join("kubelet");
    let hash = pin_hash(&[
        module.join("go.mod"),
        module.join("go.sum"),
        module.join("main.go"),
    ])?;
    let names: Vec<&str> = NODE_BINARIES.iter().map(|(n, _)| *n).collect();
    let (dir, cached) = cache_entry(&format!("kubelet-{version}-{}-{hash}", go.version), &names);
    if cached {
        eprintln!(
            "xtask: kubelet, kube-scheduler {version} cached in {}",
            dir.display()
        );
        return Ok(dir);
    }
    build_into(&dir, &format!("kubelet, kube-scheduler {version}"), |tmp| {
        let mut cmd = go.command(&module);
        cmd.args(["build", "-mod=readonly", "-trimpath", "-ldflags"])
            .arg(version_ldflags(version)?)
            .arg("-o")
            .arg(tmp.join("node"))
            .arg(".");
        run(&mut cmd)?;
        for name in &names {
            symlink("node", tmp.join(name))?;
        }
        check_version(&tmp.join("kubelet"), &["--version"], version)
    })?;
    Ok(dir)
}

/// The pod sandboxes' pause binary, from `build/pause/linux/pause.c` of the
/// `k8s.io/kubernetes` module the kubelet builds from, linked statically as
/// upstream's image has it (`-Os -static`). Returns the binary.
fn build_pause(go: &Go, version: &str) -> Result<PathBuf> {
    let (dir, cached) = cache_entry(&format!("pause-{PAUSE_VERSION}-{version}"), &["pause"]);
    if cached {
        eprintln!("xtask: pause {PAUSE_VERSION} cached in {}", dir.display());
        return Ok(dir.join("pause"));
    }
    let info = go.mod_download(
        &modules_dir().join("kubelet"),
        &format!("k8s.io/kubernetes@{version}"),
    )?;
    let source = PathBuf::from(info["Dir"].as_str().context("module Dir")?)
        .join("build/pause/linux/pause.c");
    build_into(&dir, &format!("pause {PAUSE_VERSION}"), |tmp| {
        run(Command::new("gcc")
            .args(["-Os", "-Wall", "-Werror", "-static"])
            .arg(format!("-DVERSION=v{PAUSE_VERSION}"))
            .arg("-o")
            .arg(tmp.join("pause"))
            .arg(&source))
        .context("gcc could not build the pause binary (Debian's gcc and libc6-dev)")?;
        check_version(&tmp.join("pause"), &["-v"], PAUSE_VERSION)
    })?;
    Ok(dir.join("pause"))
}

/// `-ldflags` stamping `version` into a Kubernetes component, as upstream's release
/// build does (else it says `v0.0.0-master`).
fn version_ldflags(version: &str) -> Result<String> {
    let (major, minor) = major_minor(version)?;
    let v = "k8s.io/component-base/version";
    Ok(format!(
        "-s -w -X {v}.gitVersion={version} -X {v}.gitMajor={major} -X {v}.gitMinor={minor} \
         -X {v}.gitTreeState=clean"
    ))
}

/// The Kubernetes release to build: `HAIRPIN_K8S_VERSION`, else the default.
fn k8s_version() -> String {
    std::env::var("HAIRPIN_K8S_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| {
            if v.starts_with('v') {
                v
            } else {
                format!("v{v}")
            }
        })
        .unwrap_or_else(|| DEFAULT_K8S_VERSION.to_string())
}

fn modules_dir() -> PathBuf {
    workspace_root().join("xtask/k8s")
}

/// The Go toolchain: `go` on PATH, else the official tarball's `/usr/local/go`.
struct Go {
    bin: PathBuf,
    /// `go1.26.8`.
    version: String,
}

impl Go {
    fn find() -> Result<Go> {
        let candidates = [PathBuf::from("go"), PathBuf::from("/usr/local/go/bin/go")];
        for bin in candidates {
            let Ok(out) = Command::new(&bin).args(["env", "GOVERSION"]).output() else {
                continue;
            };
            if out.status.success() {
                let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
                return Ok(Go { bin, version });
            }
        }
        bail!(
            "no Go toolchain: the real Kubernetes components build from source and need Go 1.26 \
             or newer (`go` on PATH or /usr/local/go/bin/go; https://go.dev/dl/)"
        )
    }

    /// `go mod download -json MODULE` in `dir`: the module's cache entry as Go
    /// describes it (`Dir`, `GoMod`, ...), checked against `dir`'s go.sum when it
    /// lists the module.
    fn mod_download(&self, dir: &Path, module: &str) -> Result<serde_json::Value> {
        let out = self
            .command(dir)
            .args(["mod", "download", "-json", module])
            .output()
            .with_context(|| format!("go mod download {module}"))?;
        if !out.status.success() {
            bail!(
                "go mod download {module}: not in the module cache nor served: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).context("parse `go mod download -json`")
    }

    /// `go ARGS` in `dir`, never touching the committed go.mod/go.sum
    /// (`-mod=readonly` is passed by the callers), never switching toolchains.
    fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.current_dir(dir)
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-buildvcs=false")
            // Static binaries, as Kubernetes releases its own; also one fixed build
            // configuration whatever C compiler the machine has, so the build cache
            // is shared between runs.
            .env("CGO_ENABLED", "0");
        cmd
    }
}

/// FNV-1a over the pin's files: a changed pin is a new cache entry.
fn pin_hash(files: &[PathBuf]) -> Result<String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in files {
        let bytes = fs::read(f).with_context(|| format!("read {}", f.display()))?;
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{:08x}", h >> 32))
}

/// The cache directory of one build; `None` with the directory when it holds
/// every one of `names` already.
fn cache_entry(key: &str, names: &[&str]) -> (PathBuf, bool) {
    let dir = cache::cache_dir().join("k8s").join(key);
    let complete = names.iter().all(|n| dir.join(n).exists());
    (dir, complete)
}

/// Builds into a fresh temporary directory beside `dir`, then renames it into
/// place: an interrupted build never leaves a half-filled cache entry.
fn build_into(dir: &Path, what: &str, build: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let parent = dir.parent().context("cache entry has a parent")?;
    fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    let key = dir.file_name().context("cache entry has a name")?;
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        key.to_string_lossy()
    ));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let started = Instant::now();
    eprintln!("xtask: building {what} from the Go module proxy (cold: minutes)");
    build(&tmp)?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&tmp, dir).with_context(|| format!("move the build into {}", dir.display()))?;
    eprintln!(
        "xtask: built {what} in {:.0} s -> {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(())
}

/// The go.mod the `version` build reads: the module's own for the default release,
/// else a committed pin under versions/.
fn kube_modfile(version: &str) -> Result<Option<PathBuf>> {
    if version == DEFAULT_K8S_VERSION {
        return Ok(None);
    }
    let file = modules_dir().join(format!("kubernetes/versions/{version}.mod"));
    if !file.exists() {
        bail!(
            "HAIRPIN_K8S_VERSION={version} has no pin in xtask/k8s/kubernetes/versions/: \
             write one with `cargo xtask k8s --pin {version}` and commit it"
        );
    }
    Ok(Some(file))
}

/// kube-apiserver, kube-controller-manager and kube-proxy: one multi-call binary
/// (`kube`), linked once, and a symlink per component. Returns the directory.
fn build_kube(go: &Go, version: &str) -> Result<PathBuf> {
    let module = modules_dir().join("kubernetes");
    let modfile = kube_modfile(version)?;
    let (gomod, gosum) = match &modfile {
        Some(m) => (m.clone(), m.with_extension("sum")),
        None => (module.join("go.mod"), module.join("go.sum")),
    };
    let hash = pin_hash(&[gomod, gosum, module.join("main.go")])?;
    let names: Vec<&str> = KUBE_BINARIES.iter().map(|(n, _)| *n).collect();
    let (dir, cached) = cache_entry(
        &format!("kubernetes-{version}-{}-{hash}", go.version),
        &names,
    );
    if cached {
        eprintln!(
            "xtask: Kubernetes {version} components cached in {}",
            dir.display()
        );
        return Ok(dir);
    }
    let what = format!("kube-apiserver, kube-controller-manager, kube-proxy {version}");
    build_into(&dir, &what, |tmp| {
        let ldflags = version_ldflags(version)?;
        let mut cmd = go.command(&module);
        cmd.args(["build", "-mod=readonly", "-trimpath"]);
        if let Some(m) = &modfile {
            cmd.arg(format!("-modfile={}", m.display()));
        }
        cmd.args(["-ldflags", &ldflags, "-o"])
            .arg(tmp.join("kube"))
            .arg(".");
        run(&mut cmd)?;
        for name in &names {
            symlink("kube", tmp.join(name))?;
        }
        check_version(&tmp.join("kube-apiserver"), &["--version"], version)
    })?;
    Ok(dir)
}

/// `v1.37.2` -> (`1`, `37`).
fn major_minor(version: &str) -> Result<(&str, &str)> {
    let mut parts = version.trim_start_matches('v').split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => bail!("Kubernetes version {version:?} is not vMAJOR.MINOR.PATCH"),
    }
}

/// A module of ours whose only content is one `tool` (its main package): etcd and
/// CoreDNS. Returns the binary.
fn build_tool(go: &Go, name: &str, version: &str, package: &str, flag: &[&str]) -> Result<PathBuf> {
    let module = modules_dir().join(name);
    let hash = pin_hash(&[module.join("go.mod"), module.join("go.sum")])?;
    let (dir, cached) = cache_entry(&format!("{name}-{version}-{}-{hash}", go.version), &[name]);
    if cached {
        eprintln!("xtask: {name} {version} cached in {}", dir.display());
        return Ok(dir.join(name));
    }
    build_into(&dir, &format!("{name} {version}"), |tmp| {
        run(go
            .command(&module)
            .args([
                "build",
                "-mod=readonly",
                "-trimpath",
                "-ldflags",
                "-s -w",
                "-o",
            ])
            .arg(tmp.join(name))
            .arg(package))?;
        check_version(&tmp.join(name), flag, version.trim_start_matches('v'))
    })?;
    Ok(dir.join(name))
}

/// Runs `bin FLAG` and checks the output names `version`.
fn check_version(bin: &Path, flag: &[&str], version: &str) -> Result<()> {
    let out = Command::new(bin)
        .args(flag)
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !text.contains(version) {
        bail!(
            "{} {flag:?} does not print {version}: {text}",
            bin.display()
        );
    }
    eprintln!(
        "xtask: {}: {}",
        bin.display(),
        text.lines().next().unwrap_or("")
    );
    Ok(())
}

/// Writes `xtask/k8s/kubernetes/versions/VERSION.{mod,sum}` for another release:
/// the staging modules its own go.mod replaces, each at the matching v0 release,
/// resolved with `go mod tidy` in a scratch copy of the module.
fn pin(version: &str) -> Result<()> {
    let go = Go::find()?;
    let version = if version.starts_with('v') {
        version.to_string()
    } else {
        format!("v{version}")
    };
    let (_, minor) = major_minor(&version)?;
    let patch = version.rsplit('.').next().unwrap_or("0");
    let staging = format!("v0.{minor}.{patch}");
    let scratch = std::env::temp_dir().join(format!("hairpin-k8s-pin-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    // The release's own go.mod names its staging modules (`=> ./staging/...`).
    let info = go.mod_download(&scratch, &format!("k8s.io/kubernetes@{version}"))?;
    let upstream = fs::read_to_string(info["GoMod"].as_str().context("GoMod path")?)?;
    let replaces: Vec<String> = upstream
        .lines()
        .filter(|l| l.contains("=> ./staging/"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|m| format!("\t{m} => {m} {staging}\n"))
        .collect();
    let go_line = upstream
        .lines()
        .find(|l| l.starts_with("go "))
        .context("upstream go.mod has a go line")?;
    let gomod = format!(
        "// Kubernetes {version} for `HAIRPIN_K8S_VERSION={version}`: written by \
         `cargo xtask k8s --pin {version}`.\nmodule hairpin.dev/xtask/k8s/kubernetes\n\n\
         {go_line}\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n{}\n)\n",
        replaces.concat()
    );
    fs::write(scratch.join("go.mod"), gomod)?;
    fs::copy(
        modules_dir().join("kubernetes/main.go"),
        scratch.join("main.go"),
    )?;
    run(go.command(&scratch).args(["mod", "tidy"]))?;
    let versions = modules_dir().join("kubernetes/versions");
    fs::create_dir_all(&versions)?;
    fs::copy(
        scratch.join("go.mod"),
        versions.join(format!("{version}.mod")),
    )?;
    fs::copy(
        scratch.join("go.sum"),
        versions.join(format!("{version}.sum")),
    )?;
    let _ = fs::remove_dir_all(&scratch);
    println!("{}", versions.join(format!("{version}.mod")).display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_minor_of_a_release() {
        assert_eq!(major_minor("v1.37.2").unwrap(), ("1", "37"));
        assert_eq!(major_minor("1.34.4").unwrap(), ("1", "34"));
        assert!(major_minor("latest").is_err());
    }

    #[test]
    fn the_pin_hash_follows_the_files() {
        let dir = std::env::temp_dir().join(format!("xtask-k8s-hash-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("go.sum");
        fs::write(&f, "a").unwrap();
        let one = pin_hash(std::slice::from_ref(&f)).unwrap();
        assert_eq!(one, pin_hash(std::slice::from_ref(&f)).unwrap());
        fs::write(&f, "b").unwrap();
        assert_ne!(one, pin_hash(std::slice::from_ref(&f)).unwrap());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_committed_pin_has_its_sums() {
        let versions = modules_dir().join("kubernetes/versions");
        for e in fs::read_dir(versions).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "mod") {
                assert!(
                    p.with_extension("sum").exists(),
                    "{} has no .sum",
                    p.display()
                );
            }
        }
        assert!(kube_modfile(DEFAULT_K8S_VERSION).unwrap().is_none());
        assert!(kube_modfile("v1.34.4").unwrap().is_some());
        assert!(kube_modfile("v1.0.0").is_err());
    }
}
