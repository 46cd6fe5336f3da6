//! Unit tests of the release set's pieces (the whole set is `cargo xtask release`).

use std::{fs, process::Command};

use super::{
    oci::{deterministic_tar, manifest_digest, platform_tag, read_index, write_index},
    verify::PrivateStore,
    *,
};
use crate::image::Arch;

#[test]
fn the_digest_goes_into_the_image_block_of_values_yaml_and_nothing_else_changes() {
    let values = fs::read_to_string(workspace_root().join("deploy/chart/hairpin/values.yaml"))
        .expect("values.yaml");
    let d = format!("sha256:{}", "0f".repeat(32));
    let with = values_with_digest(&values, &d).expect("edited");
    assert_eq!(with.replace(&format!("\"{d}\""), "\"\""), values);
    assert!(
        values_with_digest(&with, &d).is_err(),
        "no second empty digest"
    );
}

#[test]
fn every_version_in_the_repository_is_the_workspaces() {
    check_versions(version()).expect("one version");
    let e = check_versions("9.9.9").expect_err("a mismatch");
    assert!(e.to_string().contains("expected \"9.9.9\""), "{e}");
}

#[test]
fn a_bom_loses_its_serial_and_time_and_says_it_is_reproducible() {
    let mut bom = serde_json::json!({"bomFormat": "CycloneDX", "specVersion": "1.5",
        "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79",
        "metadata": {"timestamp": "2026-01-01T00:00:00Z", "component": {"name": "x"}}});
    let text = reproducible_bom(&mut bom).expect("bom");
    assert!(
        !text.contains("serialNumber") && !text.contains("timestamp"),
        "{text}"
    );
    assert_eq!(bom["metadata"]["properties"][0]["name"], "cdx:reproducible");
    assert_eq!(bom["metadata"]["component"]["name"], "x");
    assert!(reproducible_bom(&mut serde_json::json!({"bomFormat": "SPDX"})).is_err());
}

#[test]
fn the_archive_depends_on_the_content_alone() {
    let base = std::env::temp_dir().join(format!("hairpin-tar-{}", std::process::id()));
    let (a, b) = (base.join("a"), base.join("b"));
    for (dir, when) in [(&a, "@1000"), (&b, "@2000")] {
        fs::create_dir_all(dir.join("blobs")).expect("dir");
        fs::write(dir.join("index.json"), "{}").expect("file");
        fs::write(dir.join("blobs/x"), "x").expect("file");
        run(Command::new("touch")
            .args(["-d", when])
            .arg(dir.join("index.json")))
        .expect("touch");
    }
    deterministic_tar(&a, &base.join("a.tar"), 42).expect("tar");
    deterministic_tar(&b, &base.join("b.tar"), 42).expect("tar");
    let bytes = |p: &str| fs::read(base.join(p)).expect("read");
    assert_eq!(bytes("a.tar"), bytes("b.tar"));
    let _ = fs::remove_dir_all(&base);
}

/// The release's own check on a machine where the image was built a moment before
/// under another tag (`cargo xtask test` builds the dev image): loaded into that
/// store, the archive only re-tags the image and podman reports the digest of the
/// manifest it stored at build time; loaded into a store of its own, the archive's.
/// Real podman, two private stores, a 1-file image: a few seconds.
#[test]
fn the_archive_is_checked_in_an_empty_store_not_the_one_that_built_it() {
    if Command::new("podman").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "podman is missing");
        return;
    }
    let dir = std::env::temp_dir().join(format!("xtask-release-store-{}", std::process::id()));
    let context = dir.join("context");
    fs::create_dir_all(&context).expect("context");
    fs::write(context.join("f"), "hairpin\n").expect("file");
    fs::write(
        context.join("Containerfile"),
        "FROM scratch\nCOPY f /f\nLABEL org.opencontainers.image.title=t\n",
    )
    .expect("Containerfile");
    let built = PrivateStore::new(&dir.join("built")).expect("store");
    for tag in [
        "localhost/hairpin-agent:dev",
        "ghcr.io/hairpin-dev/hairpin-agent:0.0.0",
    ] {
        run(built
            .podman()
            .args(["build", "--quiet", "--pull=never", "--network=none"])
            .args([
                "--layers=false",
                "--identity-label=false",
                "--timestamp",
                "1700000000",
            ])
            .args(["--runtime", "runc", "--tag", tag])
            .arg(&context))
        .expect("podman build");
    }
    let tag = "ghcr.io/hairpin-dev/hairpin-agent:0.0.0";
    let layout = dir.join("layout");
    run(built
        .podman()
        .args(["save", "--format", "oci-dir", "--output"])
        .arg(&layout)
        .arg(tag))
    .expect("podman save");
    let want = manifest_digest(&layout).expect("digest");
    let archive = dir.join("image.oci.tar");
    deterministic_tar(&layout, &archive, 1_700_000_000).expect("tar");
    // What the check did before: rmi the tag (the dev tag keeps the image), load.
    run(built.podman().args(["rmi", "--force", tag])).expect("rmi");
    let shared = built.loaded_digest(&archive, tag).expect("load");
    assert_ne!(
        shared, want,
        "the store that built the image reports the archive's digest: the cause is gone"
    );
    let fresh = PrivateStore::new(&dir.join("fresh")).expect("store");
    assert_eq!(fresh.loaded_digest(&archive, tag).expect("load"), want);
    drop((built, fresh));
    fs::remove_dir_all(&dir).expect("cleanup");
}

/// The release's image index, built as the release builds it (a platform's image per
/// tag, `podman manifest create`/`add`/`push --all --format oci`) from 1-file images
/// for both platforms in a private store: twice the same index digest, both platforms
/// listed in order, and a fresh store that loads the archive reports the index's
/// digest under the release's tag (what the packaged chart pins). A few seconds.
#[test]
fn the_two_platform_index_is_reproducible_and_loads_under_its_digest() {
    if Command::new("podman").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "podman is missing");
        return;
    }
    let dir = std::env::temp_dir().join(format!("xtask-release-index-{}", std::process::id()));
    let context = dir.join("context");
    fs::create_dir_all(&context).expect("context");
    fs::write(context.join("f"), "hairpin\n").expect("file");
    fs::write(context.join("Containerfile"), "FROM scratch\nCOPY f /f\n").expect("Containerfile");
    let built = PrivateStore::new(&dir.join("built")).expect("store");
    let tag = "ghcr.io/hairpin-dev/hairpin-agent:0.0.0";
    let mut images = Vec::new();
    for arch in Arch::ALL {
        let image = platform_tag(tag, arch);
        run(built
            .podman()
            .args(["build", "--quiet", "--pull=never", "--network=none"])
            .args(["--layers=false", "--identity-label=false"])
            .args(["--timestamp", "1700000000", "--runtime", "runc"])
            .args(["--platform", &arch.platform(), "--tag", &image])
            .arg(&context))
        .expect("podman build");
        images.push(image);
    }
    let podman = || built.podman();
    let first = write_index(&podman, tag, &images, &dir.join("a")).expect("index");
    let second = write_index(&podman, tag, &images, &dir.join("b")).expect("index again");
    assert_eq!(first, second, "the same images give the same index");
    let archs: Vec<&str> = first.platforms.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(archs, ["amd64", "arm64"]);
    assert_ne!(first.platforms[0].1, first.platforms[1].1);
    assert_eq!(read_index(&dir.join("b")).expect("read"), first);
    let archive = dir.join("image.oci.tar");
    deterministic_tar(&dir.join("a"), &archive, 1_700_000_000).expect("tar");
    let fresh = PrivateStore::new(&dir.join("fresh")).expect("store");
    assert_eq!(
        fresh.loaded_digest(&archive, tag).expect("load"),
        first.digest
    );
    drop((built, fresh));
    fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn libtests_summary_gives_passed_and_skipped() {
    let out = "running 3 tests\ntest a ... ok\n\ntest result: ok. 212 passed; 0 failed; 1 ignored; 0 measured; 4 filtered out; finished in 9.31s\n";
    let c = super::qemu::parse_counts(out).expect("counts");
    assert_eq!((c.passed, c.skipped), (212, 5));
    assert!(super::qemu::parse_counts("no summary").is_err());
}

/// Every test the qemu run skips exists in the agent's sources under that name: a
/// renamed test would otherwise run (and fail under qemu) or a skip would outlive it.
#[test]
fn every_test_skipped_under_qemu_exists() {
    for (name, why) in super::qemu::SKIPPED {
        assert!(!why.is_empty(), "{name}: no reason");
        let (module, test) = name.rsplit_once("::").unwrap_or(("", name));
        let file = ["hairpin-agent/src", module]
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.replace("::", "/"))
            .collect::<Vec<_>>()
            .join("/");
        let candidates = [
            format!("{file}.rs"),
            format!("{file}/mod.rs"),
            format!("{}.rs", file.trim_end_matches("/tests")),
        ];
        let found = candidates.iter().any(|c| {
            fs::read_to_string(workspace_root().join(c))
                .is_ok_and(|t| t.contains(&format!("fn {test}(")))
        });
        assert!(found, "{name}: no `fn {test}(` in {candidates:?}");
    }
}
