//! The node's images, made here because no registry can be reached: pause and
//! busybox from their static binaries, nginx from Debian's binary and the shared
//! libraries it links, the agent's from `cargo xtask image`; each saved by podman
//! and imported with `ctr -n k8s.io images import`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use super::{
    AGENT_DEV_IMAGE, AGENT_NEXT_IMAGE, BUSYBOX_IMAGE, CHART_REPOSITORY, NGINX_IMAGE, NodeRuntime,
    PAUSE_IMAGE, next_agent_version,
};
use crate::sh::run;

/// Debian's nginx, which the ingress pods run.
const NGINX_BIN: &str = "/usr/sbin/nginx";

impl NodeRuntime {
    /// Imports the pause, busybox and nginx images and the agent's, under the
    /// chart's name.
    pub(super) fn import_images(&self, pause_bin: &Path) {
        self.build_image(
            PAUSE_IMAGE,
            &[(pause_bin.to_path_buf(), "/pause".into())],
            "/pause",
        );
        let busybox = Path::new("/bin/busybox");
        let kind = run(&["file", "-L", "/bin/busybox"]);
        assert!(
            kind.contains("statically linked"),
            "/bin/busybox is not static (install busybox-static): {kind}"
        );
        self.build_image(
            BUSYBOX_IMAGE,
            &[(busybox.to_path_buf(), "/bin/busybox".into())],
            "/bin/busybox",
        );
        self.build_image(
            NGINX_IMAGE,
            &with_libraries(Path::new(NGINX_BIN)),
            NGINX_BIN,
        );
        self.save_and_import(AGENT_DEV_IMAGE);
        self.ctr(&[
            "images",
            "tag",
            "--force",
            AGENT_DEV_IMAGE,
            &self.agent_image,
        ]);
    }

    /// An image `FROM scratch` of `files` (each (source, path in the image)) with
    /// `entry` as its entrypoint, imported as `tag`.
    fn build_image(&self, tag: &str, files: &[(PathBuf, String)], entry: &str) {
        let ctx = self
            .dir
            .join(format!("image-{}", tag.replace(['/', ':'], "-")));
        let root = ctx.join("rootfs");
        for (from, to) in files {
            let at = root.join(to.trim_start_matches('/'));
            fs::create_dir_all(at.parent().expect("a file in a directory")).expect("image dir");
            fs::copy(from, &at)
                .unwrap_or_else(|e| panic!("copy {} into the image: {e}", from.display()));
        }
        fs::write(
            ctx.join("Containerfile"),
            format!("FROM scratch\nCOPY rootfs /\nENTRYPOINT [\"{entry}\"]\n"),
        )
        .expect("Containerfile");
        let c = ctx.to_str().expect("utf-8 path");
        // A name of this node's own in podman's storage: scenarios run in
        // parallel, and one's `rmi` must not take another's image.
        let local = self.local_name(tag);
        run(&["podman", "build", "-q", "--tag", &local, c]);
        self.save_and_import(&local);
        let _ = Command::new("podman").args(["rmi", "-f", &local]).output();
        self.ctr(&["images", "tag", "--force", &local, tag]);
        let _ = fs::remove_dir_all(&ctx);
    }

    /// The next version's image ([`AGENT_NEXT_IMAGE`]) under the chart's repository
    /// and its version (its `org.opencontainers.image.version` label, what its agent
    /// reports), as a new release's image arrives on a node. Returns (name, version).
    pub fn import_next_agent(&self) -> (String, String) {
        let version = next_agent_version()
            .unwrap_or_else(|| panic!("no {AGENT_NEXT_IMAGE}: run `cargo xtask test`"));
        self.save_and_import(AGENT_NEXT_IMAGE);
        let name = format!("{CHART_REPOSITORY}:{version}");
        self.ctr(&["images", "tag", "--force", AGENT_NEXT_IMAGE, &name]);
        (name, version)
    }

    /// `name` with this node's cgroup name in its repository.
    fn local_name(&self, name: &str) -> String {
        let (repo, tag) = name.rsplit_once(':').expect("name:tag");
        format!("{repo}-{}:{tag}", self.cgroup_name)
    }

    fn save_and_import(&self, tag: &str) {
        let archive = self.dir.join("image.tar");
        let a = archive.to_str().expect("utf-8 path");
        let _ = fs::remove_file(&archive);
        run(&["podman", "save", "--format", "docker-archive", "-o", a, tag]);
        self.ctr(&["images", "import", "--digests", a]);
        let _ = fs::remove_file(&archive);
    }
}

/// `bin` and every shared object `ldd` says it loads (the dynamic loader among
/// them), each at its own path.
fn with_libraries(bin: &Path) -> Vec<(PathBuf, String)> {
    let listing = run(&["ldd", bin.to_str().expect("utf-8 path")]);
    assert!(
        !listing.contains("not found"),
        "{} needs a library this machine lacks: {listing}",
        bin.display()
    );
    let mut files = vec![(bin.to_path_buf(), bin.display().to_string())];
    files.extend(
        libraries(&listing)
            .into_iter()
            .map(|p| (PathBuf::from(&p), p)),
    );
    files
}

/// The absolute paths in `ldd`'s listing: `libc.so.6 => /lib/.../libc.so.6 (0x..)`
/// and the loader's own `/lib64/ld-linux-x86-64.so.2 (0x..)`; the vDSO has none.
fn libraries(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| path.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ldd_listings_give_each_library_and_the_loader() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffd)\n\
            \tlibcrypt.so.1 => /lib/x86_64-linux-gnu/libcrypt.so.1 (0x00007f1)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            super::libraries(listing),
            [
                "/lib/x86_64-linux-gnu/libcrypt.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ]
        );
    }
}
