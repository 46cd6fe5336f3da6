// The Gateway API CRDs for the real_cluster suite (the module's config/crd), with
// the sums committed here. `cargo xtask k8s` copies them into its cache.
module hairpin.dev/xtask/k8s/gateway-api

go 1.26.0

require sigs.k8s.io/gateway-api v1.6.3
