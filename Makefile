# cellium's build. `make up` runs a local cluster, `make test` runs every test;
# both install what they need first (hack/install-deps.sh).

GO        ?= go
BIN       := bin
BINARIES  := cellium-agent cellium-operator cellium-cni cellium
DEVDIR    ?= .cellium-dev
# CI sets CI=true: privileged tests must then run, not skip.
ifeq ($(CI),true)
export CELLIUM_REQUIRE_PRIVILEGED := 1
endif
TEST_FLAGS ?= -race -timeout 45m

.PHONY: all build deps k8s-binaries node-binaries kubectl k8s-node-binaries containerd-binaries coredns-binary hubble-binaries test test-realnode test-modes test-unit vet lint generate bpf manifests up down scale bench bench-endpoints bench-policy bench-reconciler bench-hubble bench-hubble-datapath bench-datapath fuzz-datapath soak e2e-binaries e2e-netpol e2e-netpol-realnode e2e-conformance e2e-conformance-realnode e2e-services clean

all: build

## build: compile the binaries into bin/, static and without the checkout's paths:
## make up's image packer (realnode.ImageBuildFlags) then finds them current
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./daemon/cellium-agent ./operator/cellium-operator ./cni/cellium-cni ./cli/cellium ./test/cmd/devkubelet ./test/cmd/devcluster

## deps: install system packages and Go tools (idempotent)
deps:
	./hack/install-deps.sh

## k8s-binaries: build etcd, kube-apiserver, kube-controller-manager and helm into the cache
k8s-binaries:
	$(GO) run ./test/cmd/devcluster build

## node-binaries: the real node's programs (kubelet, kube-scheduler, kube-proxy,
## containerd, ctr, containerd-shim-runc-v2, the CNI loopback plugin, CoreDNS)
## into the cache, and Debian's runc; the first build takes ~20 minutes on 2 cores
node-binaries: deps k8s-node-binaries containerd-binaries coredns-binary

## kubectl: kubectl of the cluster's version into the cache (make up builds it
## when there is no kubectl on $PATH)
kubectl:
	nice -n 19 $(GO) run ./test/cmd/devcluster build-kubectl

## k8s-node-binaries: kubelet, kube-scheduler and kube-proxy into the cache
k8s-node-binaries:
	nice -n 19 $(GO) run ./test/cmd/devcluster build-node --only kubernetes

## containerd-binaries: containerd, ctr, containerd-shim-runc-v2 (no cgo) and
## the CNI loopback plugin into the cache
containerd-binaries:
	nice -n 19 $(GO) run ./test/cmd/devcluster build-node --only containerd

## coredns-binary: CoreDNS (tools/coredns, no cgo), the cluster DNS of make up
coredns-binary:
	nice -n 19 $(GO) run ./test/cmd/devcluster build-node --only coredns

## hubble-binaries: the upstream hubble CLI and hubble-relay (tools/hubble, the
## github.com/cilium/cilium version it requires) into the cache: the clients
## of the Hubble API tests (~10 minutes the first time, cached after)
hubble-binaries:
	nice -n 19 $(GO) run ./test/cmd/devcluster build-hubble

## test: vet, then every test (integration tests use the real apiserver); the
## real-node package runs after the others, alone (its nodes' kubelets change
## machine-wide sysctls and want the host network lock), and not at all under
## CI=true, where test-realnode runs it next
test: deps k8s-binaries hubble-binaries vet
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/test/realnode$$')
ifndef CI
	$(GO) test $(TEST_FLAGS) ./test/realnode/
endif

## test-realnode: the real node (kubelet, containerd, runc, kube-proxy) smoke
## tests; builds the node binaries first (~15 minutes cold, cached after).
## Separate from `test` so that a cold `make test` stays short; CI runs both.
test-realnode: deps k8s-binaries node-binaries
	CELLIUM_REAL_NODE=1 $(GO) test $(TEST_FLAGS) -count=1 ./test/realnode/

## test-modes: only the mode matrix ({CEP, CES} x {CRD, kvstore} and the two
## double-write migration modes: endpoints, identities, policy, two nodes)
## against the real API server and etcd;
## make test runs three of the six modes. MODES=mode=ces/identity=kvstore picks
## modes (comma-separated; Documentation/contributing/testing.md#the-mode-matrix)
MODES ?= all
test-modes: k8s-binaries
	CELLIUM_TEST_MODES=$(MODES) $(GO) test $(TEST_FLAGS) -count=1 -run 'TestModes|TestCiliumEndpointSlicesSameIPCache|TestCiliumEndpointSliceBadInput' ./test/integration/

## test-unit: the fast tests only
test-unit:
	$(GO) test -short ./...

vet:
	$(GO) vet ./...

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## generate: regenerate deepcopy, CRD YAML and the typed clientset
generate:
	./hack/update-codegen.sh

## bpf: compile bpf/*.c with clang-19 and regenerate the committed bpf2go
## output in datapath/bpf (TestGeneratedBPFUpToDate checks it is current)
bpf:
	$(GO) generate ./datapath/bpf/

## manifests: render the Helm chart into install/kubernetes/cellium.yaml (builds helm once)
manifests:
	$(GO) run ./install/cmd/render-manifests

## up: a local cluster on this machine: etcd, kube-apiserver, kube-controller-manager
## and a real node (containerd, kubelet, kube-scheduler, kube-proxy) with cellium
## installed from its chart (DaemonSet, Deployment), demo pods (root).
## NODE=dev runs the devkubelet and an agent process instead (no node binaries).
## UP_FLAGS adds devcluster up flags, e.g. UP_FLAGS="--set agent.ipv4Masquerade=true".
## NODES=N (1 to 4, default 1) asks for N real nodes; several run each in network and
## mount namespaces of their own (Documentation/contributing/real-node.md).
## KPR=true runs no kube-proxy: cellium's kube-proxy replacement serves every Service
## (Documentation/operations/kube-proxy-replacement.md).
NODE ?= real
NODES ?= 1
KPR ?= false
UP_FLAGS ?=
up: deps k8s-binaries build $(if $(filter real,$(NODE)),node-binaries)
	$(BIN)/devcluster up --dir $(DEVDIR) --bin-dir $(BIN) --node $(NODE) $(if $(filter real,$(NODE)),--nodes $(NODES)) $(if $(filter true,$(KPR)),--kube-proxy-replacement) $(UP_FLAGS)

## down: stop what `make up` started and remove everything it made on the host
down:
	$(GO) run ./test/cmd/devcluster down --dir $(DEVDIR)

## bench-endpoints: create and delete N pods through the real CNI path and print latencies (root)
N ?= 100
bench-endpoints: deps k8s-binaries build
	$(BIN)/devkubelet bench -n $(N) --bin-dir $(BIN)

## soak: the chaos soak for DURATION (default 30m) against the real binaries (root);
## SEED=N repeats a run, SKIP=add-retry,... leaves actions out, DATAPATH=false runs the agent
## without its eBPF datapath. `make test` runs 2 minutes of it.
DURATION     ?= 30m
SEED         ?= 0
SKIP         ?=
DATAPATH     ?= true
SOAK_TIMEOUT ?= 3h
soak: deps k8s-binaries
	CELLIUM_REQUIRE_PRIVILEGED=1 CELLIUM_SOAK_DURATION=$(DURATION) CELLIUM_SOAK_SEED=$(SEED) CELLIUM_SOAK_SKIP=$(SKIP) CELLIUM_SOAK_DATAPATH=$(DATAPATH) \
		$(GO) test -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestPrivilegedSoak$$' ./test/soak/

## scale: the scale simulation (Documentation/operations/scale.md): one real agent and operator
## among NODES other nodes' objects (CiliumNodes, PODS pods' CiliumEndpoints, IDENTITIES identities,
## SERVICES Services, POLICIES NetworkPolicies) on a real API server, churned at CHURN changes/s
## for CHURN_DURATION; MODE=cep|ces|kvstore|both|all (kvstore: identities in etcd). Prints one
## markdown table (also into SCALE_OUT if set); SCALE_FLAGS adds flags (e.g.
## -operator-arg=--ces-write-qps-limit=50, -heap-profile=/tmp/heap.pprof). Defaults: the CI size.
NODES_SCALE_DEFAULT := 100
MODE           ?= both
PODS           ?= 2000
SERVICES       ?= 200
POLICIES       ?= 100
IDENTITIES     ?= 1000
CHURN          ?= 50
CHURN_DURATION ?= 10s
SCALE_OUT      ?=
SCALE_FLAGS    ?=
scale: deps k8s-binaries
	nice -n 10 $(GO) run ./test/cmd/scale -mode $(MODE) -nodes $(if $(filter command line environment,$(origin NODES)),$(NODES),$(NODES_SCALE_DEFAULT)) \
		-pods $(PODS) -services $(SERVICES) -policies $(POLICIES) -identities $(IDENTITIES) -churn $(CHURN) \
		-churn-duration $(CHURN_DURATION) $(if $(SCALE_OUT),-out $(SCALE_OUT)) $(SCALE_FLAGS)

## bench: reconciler and statedb benchmarks; as root also the BPF map reconcilers
## (10k-entry policy map update in entries/s, 50k ipcache prefixes in prefixes/s)
bench:
	$(GO) test -run '^$$' -bench . -benchtime 20000x ./statedb/reconciler/
	$(GO) test -run '^$$' -bench 'Privileged' -benchtime 20x ./datapath/mapsync/

## bench-nodeport: a client outside the node -> NodePort -> pod (root, network namespaces of its own):
## request/response and connect latency through cellium's uplink program (externalTrafficPolicy
## Cluster and Local), through an nftables DNAT rule as kube-proxy's nftables mode has, and
## straight to the pod, side by side in one run
bench-nodeport:
	$(GO) test -run '^$$' -bench 'PrivilegedNodePortRR' -benchtime 2000x $(BENCH_FLAGS) ./datapath/bpf/

## bench-kpr: kube-proxy (nftables) vs cellium's kube-proxy replacement on a two-node real
## cluster of its own per mode (root, ~20 min): TCP throughput and request/response pod -> pod,
## pod -> ClusterIP -> pod across nodes and outside -> NodePort -> pod; connect latency, a Service
## change applied on every node (p50/p99) and memory/map sizes with 1, 1,000 and 10,000 Services of
## 10 backends. Prints tables; asserts nothing timed. BENCH_KPR_FLAGS adds flags (e.g. -sizes 1,1000)
BENCH_KPR_FLAGS ?=
bench-kpr: deps k8s-binaries node-binaries build
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./test/cmd/benchkpr
	$(BIN)/benchkpr -bin-dir $(BIN) $(BENCH_KPR_FLAGS)

## bench-policy: policy engine benchmarks (full computation, incremental changes, 20k non-selecting rules)
# The full computations run 5 times each, the short cases for the default
# second. BENCH_FLAGS adds flags to both (e.g. BENCH_FLAGS=-count=3).
bench-policy:
	$(GO) test -run '^$$' -bench 'FullComputation|ComputeAllEndpoints' -benchtime 5x -benchmem $(BENCH_FLAGS) ./cells/policy/
	$(GO) test -run '^$$' -bench 'IdentityAdded|RuleChanged|NoMatch20k' -benchmem $(BENCH_FLAGS) ./cells/policy/

## bench-reconciler: statedb's own reconciler benchmark workload (1M objects, write batches of 1000)
## through statedb's reconciler in a cilium/hive and through cellium's, alternating, 3 runs each
bench-reconciler:
	$(GO) run ./test/cmd/benchreconciler -runs 3 $(BENCH_FLAGS)

## bench-hubble: datapath events into enriched Hubble flows on one core (-cpu 1), through real tables
## (100 local pods, 5000 remote pods, 50 nodes): flows/s, cpu-ns/flow, flows/cpu-s and allocs/flow; the
## cores here are shared, so read the CPU-time figures (aim: 100k flows per CPU second)
bench-hubble:
	$(GO) test -run '^$$' -bench 'ParseEnriched|ParseBare|ProducerThroughHub' -benchtime 50000x -cpu 1 -benchmem $(BENCH_FLAGS) ./cells/hubble/

## bench-hubble-datapath: Hubble on one real agent (root; API server, operator, the upstream hubble CLI; ~2 min):
## drop -> `hubble observe --follow` line latency (200 samples, aim p99 <= 100ms), then a 10 s drop flood
## from a pod: the agent's RSS before/peak/after, ServerStatus and GetFlows --last 1 latency every 100 ms,
## datapath drops vs flows vs LostEvents by source. Prints figures and PASS/MISS, asserts nothing timed
BENCH_HUBBLE_FLAGS ?=
bench-hubble-datapath: deps k8s-binaries hubble-binaries
	nice -n 10 $(GO) run ./test/cmd/benchdatapath -hubble-only $(BENCH_HUBBLE_FLAGS)

## e2e-binaries: Kubernetes' e2e.test and agnhost (from tools/k8s) into the
## cache, and the agnhost image; ~15 minutes cold on 2 cores, not part of `test`
e2e-binaries:
	nice -n 19 $(GO) run ./test/cmd/e2enetpol build

## e2e-netpol: Kubernetes' NetworkPolicy e2e specs ("[sig-network] Netpol") against
## `make up`'s cluster; FOCUS=regex narrows them (e.g. FOCUS=default-deny-ingress),
## NETPOL_SKIP=regex leaves some out, E2E_FLAGS passes more flags to e2enetpol run
## (e.g. --containerd-socket S to import the agnhost image). SCTP specs are skipped
## when the kernel has no SCTP. Prints passed/failed/skipped and the failed specs.
FOCUS       ?=
NETPOL_SKIP ?=
E2E_FLAGS   ?=
export FOCUS NETPOL_SKIP
e2e-netpol: deps k8s-binaries
	$(GO) run ./test/cmd/e2enetpol run --kubeconfig $(DEVDIR)/kubeconfig --dir $(DEVDIR)/e2e-netpol --focus "$$FOCUS" --skip "$$NETPOL_SKIP" $(E2E_FLAGS)

## e2e-netpol-realnode: the same on a cluster of its own with a real node (containerd,
## kubelet, kube-proxy, cellium-agent as a host process), stopped after the run (root)
e2e-netpol-realnode: deps k8s-binaries node-binaries
	$(GO) run ./test/cmd/e2enetpol run --realnode --dir $(DEVDIR)/e2e-netpol --focus "$$FOCUS" --skip "$$NETPOL_SKIP" $(E2E_FLAGS)

## e2e-conformance: Kubernetes' sig-network conformance specs ("[sig-network] ... [Conformance]",
## 47 in v1.37.2: Services, EndpointSlices, DNS, Networking, Proxy, HostPort) against `make up`'s
## cluster, with images packed from agnhost and this machine's sh, nc, curl, dig (make deps);
## FOCUS=regex narrows them, CONFORMANCE_SKIP=regex leaves some out. The DNS specs that resolve
## names are skipped when the cluster has no kube-dns Service in kube-system.
CONFORMANCE_SKIP ?=
export CONFORMANCE_SKIP
e2e-conformance: deps k8s-binaries
	$(GO) run ./test/cmd/e2enetpol run --suite conformance --kubeconfig $(DEVDIR)/kubeconfig --dir $(DEVDIR)/e2e-conformance --focus "$$FOCUS" --skip "$$CONFORMANCE_SKIP" $(E2E_FLAGS)

## e2e-conformance-realnode: the same on a cluster of its own with a real node, stopped after the run (root)
e2e-conformance-realnode: deps k8s-binaries node-binaries
	$(GO) run ./test/cmd/e2enetpol run --suite conformance --realnode --dir $(DEVDIR)/e2e-conformance --focus "$$FOCUS" --skip "$$CONFORMANCE_SKIP" $(E2E_FLAGS)

## e2e-services: the Services specs of Kubernetes' e2e suite outside Conformance (56 in v1.37.2:
## NodePort, externalTrafficPolicy/internalTrafficPolicy Local, session affinity and its timeout,
## terminating endpoints, ExternalIP, hairpin, HealthCheckNodePort, hostPort, the Networking
## Granular Checks of Services) against `make up`'s cluster (make up KPR=true NODES=3 to judge the
## kube-proxy replacement); the 2 [Disruptive] specs (SSH to the nodes) and the SCTP ones without
## SCTP are skipped with their reason. FOCUS=regex narrows them, SERVICES_SKIP=regex leaves some out.
SERVICES_SKIP ?=
export SERVICES_SKIP
e2e-services: deps k8s-binaries
	$(GO) run ./test/cmd/e2enetpol run --suite services --kubeconfig $(DEVDIR)/kubeconfig --dir $(DEVDIR)/e2e-services --focus "$$FOCUS" --skip "$$SERVICES_SKIP" $(E2E_FLAGS)

## bench-datapath: one report (root, ~3 min): throughput (iperf3) and request/response rate (sockperf)
## between two pods, bare veths vs cellium's programs with a policy, as ratios; policy-update-to-enforced
## latency through the agent's cells and via the map alone; map reconciler throughput; the cross-node
## rows; node join and policy change across real agents (API server, operator); PASS/MISS per aim
BENCH_DP_FLAGS ?=
bench-datapath: deps k8s-binaries
	$(GO) run ./test/cmd/benchdatapath $(BENCH_DP_FLAGS)

## fuzz-datapath: the differential fuzzer of bpf/lxc.c (FuzzDatapath: the programs against
## the reference model of datapath/bpf/model_test.go) for FUZZTIME (default 10m), one worker
## (root). New failing inputs land in datapath/bpf/testdata/fuzz/FuzzDatapath; `make test`
## runs that corpus. FUZZFLAGS adds go test flags (e.g. -fuzzminimizetime=10s: each new
## interesting input is otherwise minimized for up to a minute, without fuzzing meanwhile).
## See bpf/README.md, "The differential fuzzer".
FUZZTIME  ?= 10m
FUZZFLAGS ?=
fuzz-datapath:
	CELLIUM_REQUIRE_PRIVILEGED=1 nice -n 10 $(GO) test -run '^$$' -fuzz '^FuzzDatapath$$' -fuzztime $(FUZZTIME) -parallel 1 $(FUZZFLAGS) ./datapath/bpf/

clean:
	rm -rf $(BIN)
