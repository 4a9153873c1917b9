#!/usr/bin/env bash
# rls-compare.sh: sluice against envoyproxy/ratelimit, same Redis, same load.
#
# It builds sluice-controlplane, sluice-load and bench/ratelimit-peer
# (envoyproxy/ratelimit's service, imported unchanged), starts one
# redis-server on a free 127.0.0.1 port, and then, RUNS times, interleaved
# (in SYSTEMS' order on odd runs, reversed on even ones), for each system:
# FLUSHALL, start the system against that Redis, wait until
# it answers, warm up, reset Redis's statistics, drive it with sluice-load,
# stop it. Both systems get the same policy: domain "bench", descriptor key
# "user", a clock-aligned fixed window of REQUESTS_PER_UNIT per UNIT per user
# value (high, so answers are OK and both do their full write path).
#
# Per run it prints decisions/s, p50/p95/p99, errors, and Redis CPU per
# decision: the delta of INFO cpu (used_cpu_sys + used_cpu_user) over the
# run divided by the decisions (redis_cpu_us), and the usec INFO
# commandstats gives the commands clients sent (cmd_usec: the script calls
# for sluice, INCRBY and EXPIRE for envoyproxy/ratelimit). Then the medians
# per system.
#
# Settings (environment): RUNS (3), CALLERS (64), CONNS (4), KEYS (1000),
# DURATION (10s), WARMUP (2s), UNIT (second), REQUESTS_PER_UNIT (1000000),
# CLIENT (lean: sluice-load's minimal gRPC client; grpc: grpc-go; h2load:
# nghttp2's h2load posting one gRPC-framed ShouldRateLimit body, so every
# call is on the same key, and reporting a mean latency instead of
# percentiles, shown in the p50 column),
# SERVER_GOMAXPROCS (GOMAXPROCS for both systems under test, both being Go
# programs; empty: their default, the number of cores),
# SYSTEMS (the systems to run: "ratelimit sluice sluice-lease floor"; sluice-grpc-go
# is sluice with -grpc-server grpc-go, grpc-go's server on the decision port;
# sluice-lease is sluice with lease: auto in the policy; floor is
# controlplane/cmd/rlsfloor, sluice's decision port answering one fixed answer without
# deciding: the server CPU of the transport alone under that client),
# CONTROLPLANE (a sluice-controlplane binary to measure instead of building
# this tree's), BASE (a git revision: adds the system sluice-base, that
# revision's sluice-controlplane, so that a change is measured against its
# base in the same interleaved run, e.g. BASE=origin/main
# SYSTEMS="sluice-base sluice"), KEEP=1 to keep the work directory (logs),
# CHART (an SVG file to draw the medians into with bench/chart: decisions/s
# and CPU per decision by system). Each system runs
# with its own defaults (neither GOGC nor GOMAXPROCS is set here).
# Everything listens on 127.0.0.1; every process this script starts is
# stopped by its PID on exit.
set -euo pipefail

RUNS=${RUNS:-3}
CALLERS=${CALLERS:-64}
CONNS=${CONNS:-4}
KEYS=${KEYS:-1000}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
UNIT=${UNIT:-second}
REQUESTS_PER_UNIT=${REQUESTS_PER_UNIT:-1000000}
CLIENT=${CLIENT:-lean}
procs=${SERVER_GOMAXPROCS:-}
GO=${GO:-go}

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-rls-compare.XXXXXX")
pids=()

cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "work directory kept: $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "rls-compare: $*" >&2
	exit 1
}

# free_port sets the variable named $1 to a TCP port nothing listens on at
# 127.0.0.1 and that no earlier call chose. It picks below the kernel's
# ephemeral range: a port there may be the local end of an outgoing
# connection, which a connect probe does not see and a listener cannot bind.
used_ports=" "
eph_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
	local p
	for _ in $(seq 200); do
		p=$((10000 + RANDOM % (eph_low - 10000)))
		case "$used_ports" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			used_ports+="$p "
			printf -v "$1" '%s' "$p"
			return 0
		fi
	done
	die "no free port found"
}

# stop_pid stops one process this script started and forgets it.
stop_pid() {
	local pid=$1 keep=() p
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for p in "${pids[@]}"; do
		[ "$p" = "$pid" ] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

command -v redis-server >/dev/null || die "redis-server is not installed"
if [ "$CLIENT" = h2load ]; then
	command -v h2load >/dev/null || die "h2load is not installed (Debian: apt-get install nghttp2-client; make h2load)"
	command -v curl >/dev/null || die "curl is not installed (CLIENT=h2load checks one call's gRPC status with it)"
fi
command -v redis-cli >/dev/null || die "redis-cli is not installed"

echo "building sluice-controlplane, sluice-load and ratelimit-peer (envoyproxy/ratelimit) ..."
if [ -n "${CONTROLPLANE:-}" ]; then
	cp "$CONTROLPLANE" "$work/sluice-controlplane" # another build, to compare
else
	(cd "$root" && "$GO" build -o "$work/sluice-controlplane" ./controlplane/cmd/sluice-controlplane)
fi
(cd "$root" && "$GO" build -o "$work/sluice-load" ./controlplane/cmd/sluice-load)
(cd "$root" && "$GO" build -o "$work/rlsfloor" ./controlplane/cmd/rlsfloor)
[ -z "${CHART:-}" ] || (cd "$root" && "$GO" build -o "$work/chart" ./bench/chart)
if [ -n "${BASE:-}" ]; then
	git -C "$root" worktree add -q --detach "$work/base" "$BASE"
	(cd "$work/base" && "$GO" build -o "$work/sluice-base" ./controlplane/cmd/sluice-controlplane)
	git -C "$root" worktree remove --force "$work/base"
fi
(cd "$root/bench/ratelimit-peer" && "$GO" build -o "$work/ratelimit-peer" .)
peer_version=$(cd "$root/bench/ratelimit-peer" && "$GO" list -m -f '{{.Version}}' github.com/envoyproxy/ratelimit)

# The policy, in envoyproxy/ratelimit's format (sluice reads it as-is; its
# default algorithm is the same clock-aligned fixed window).
mkdir -p "$work/runtime/ratelimit/config" "$work/sluice"
cat >"$work/runtime/ratelimit/config/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: $UNIT
      requests_per_unit: $REQUESTS_PER_UNIT
EOF
{
	cat "$work/runtime/ratelimit/config/bench.yaml"
	echo "      algorithm: fixed_window"
} >"$work/sluice/bench.yaml"
# sluice-lease: the same policy with lease: auto (controlplane/internal/lease).
sed 's/^domain: bench$/domain: bench\nlease: auto/' "$work/sluice/bench.yaml" >"$work/sluice/bench-lease.yaml"

free_port redis_port
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
	--protected-mode yes --daemonize no --logfile "$work/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
rcli() { redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }
for _ in $(seq 100); do
	rcli PING >/dev/null 2>&1 && break
	sleep 0.1
done
rcli PING >/dev/null 2>&1 || die "redis-server did not start (see $work/redis.log)"

# proc_cpu prints the CPU time (user + system) process $1 has used, in
# seconds, from /proc/$1/stat (fields 14 and 15, in clock ticks).
proc_cpu() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.6f", ($12 + $13) / hz }' "/proc/$1/stat"
}

# redis_cpu prints Redis's used_cpu_sys + used_cpu_user, in seconds.
redis_cpu() {
	rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'
}

# redis_cmd_usec prints the usec INFO commandstats reports for the commands
# clients sent: the script calls when there are any (the commands a script
# runs are counted both in it and on their own), else every command but
# INFO, CONFIG and PING.
redis_cmd_usec() {
	rcli INFO commandstats | tr -d '\r' | awk -F'[_:=,]' '
		/^cmdstat_/ {
			u = 0; for (i = 3; i < NF; i += 2) if ($i == "usec") { u = $(i + 1); break }
			if ($2 ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/) { scripts += u; seen = 1 }
			else if ($2 !~ /^(info|config|ping)/) other += u
		}
		END { printf "%d", seen ? scripts : other }'
}

# redis_cmd_names prints the commands run since the last CONFIG RESETSTAT.
redis_cmd_names() {
	rcli INFO commandstats | tr -d '\r' | awk -F'[_:=,]' '/^cmdstat_/ && $2 != "info" && $2 != "config" { printf "%s%s=%s", sep, $2, $4; sep = " " }'
}

# json_field prints one numeric field of sluice-load's -json output.
json_field() {
	sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"
}

# wait_ready polls the gRPC address with one-call loads until one succeeds.
wait_ready() {
	local addr=$1 pid=$2 log=$3
	for _ in $(seq 150); do
		kill -0 "$pid" 2>/dev/null || die "process $pid exited early; its log: $log"
		if "$work/sluice-load" -addr "$addr" -callers 1 -conns 1 -requests 1 -duration 2s \
			-domain bench -key user >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	die "$addr did not answer within 30s; see $log"
}

# start_system starts one system on fresh ports; sets sys_pid and sys_addr.
start_system() {
	local name=$1 log=$2 grpc http debug
	free_port grpc
	free_port http
	free_port debug
	case "$name" in
	ratelimit)
		env -i PATH="$PATH" HOME="${HOME:-/tmp}" ${procs:+GOMAXPROCS=$procs} \
			REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" \
			RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
			USE_STATSD=false LOG_LEVEL=warn \
			HOST=127.0.0.1 PORT="$http" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$debug" \
			GRPC_HOST=127.0.0.1 GRPC_PORT="$grpc" \
			"$work/ratelimit-peer" >"$log" 2>&1 &
		;;
	floor)
		env ${procs:+GOMAXPROCS=$procs} "$work/rlsfloor" -addr "127.0.0.1:$grpc" >"$log" 2>&1 &
		;;
	sluice | sluice-grpc-go | sluice-base | sluice-lease)
		local server=unary bin="$work/sluice-controlplane" policy="$work/sluice/bench.yaml"
		[ "$name" = sluice-grpc-go ] && server=grpc-go
		[ "$name" = sluice-lease ] && policy="$work/sluice/bench-lease.yaml"
		[ "$name" = sluice-base ] && bin="$work/sluice-base"
		[ -x "$bin" ] || die "$name needs BASE=<git revision>"
		env ${procs:+GOMAXPROCS=$procs} "$bin" -grpc-server "$server" -grpc-addr "127.0.0.1:$grpc" -http-addr "127.0.0.1:$http" \
			-policy-addr "127.0.0.1:$debug" -redis-addrs "127.0.0.1:$redis_port" \
			-policy "$policy" -log-level warn >"$log" 2>&1 &
		;;
	esac
	sys_pid=$!
	pids+=("$sys_pid")
	sys_addr="127.0.0.1:$grpc"
	wait_ready "$sys_addr" "$sys_pid" "$log"
}

# h2load posts one body: a gRPC frame (no compression, 4-byte length) of
# RateLimitRequest{domain: "bench", descriptors: [{entries: [{key: "user",
# value: "u1"}]}]}, in protobuf's wire format.
printf '\x00\x00\x00\x00\x15\x0a\x05bench\x12\x0c\x0a\x0a\x0a\x04user\x12\x02u1' >"$work/request.bin"

# drive runs the load against $1 for $2 and writes sluice-load's -json
# fields to $3 (h2load's output converted: its mean latency as p50_ms, and
# every call that did not end in a 2xx as an error).
drive() {
	local addr=$1 duration=$2 out=$3
	local url="http://$addr/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	if [ "$CLIENT" != h2load ]; then
		"$work/sluice-load" -addr "$addr" "${load_args[@]}" -duration "$duration" -json >"$out"
		return
	fi
	# h2load counts HTTP statuses only; one call through curl checks that
	# the body gets a gRPC OK (grpc-status 0 in the trailers).
	curl -s --http2-prior-knowledge --data-binary @"$work/request.bin" -H 'content-type: application/grpc' \
		-H 'te: trailers' -D - -o /dev/null "$url" |
		tr -d '\r' | grep -qx 'grpc-status: 0' || { echo "$addr: the h2load body does not get grpc-status 0" >&2; return 1; }
	h2load -t 1 -c "$CONNS" -m $((CALLERS / CONNS)) -D "$duration" -d "$work/request.bin" \
		-H 'content-type: application/grpc' -H 'te: trailers' "$url" >"$out.h2load" || return 1
	awk '
		function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
		/^finished in/ { sub(/,/, "", $4); rate = $4 }
		/^requests:/ { done = $6 }
		/^status codes:/ { ok = $3 }
		/^time for request:/ { mean = ms($6) }
		END {
			if (done == "" || rate == "") exit 1
			printf "{\"decisions\":%d,\"decisions_per_second\":%s,\"p50_ms\":%.3f,\"errors\":%d}\n", ok, rate, mean, done - ok
		}' "$out.h2load" >"$out"
}

load_args=(-callers "$CALLERS" -conns "$CONNS" -keys "$KEYS" -client "$CLIENT" -domain bench -key user)
read -r -a systems <<<"${SYSTEMS:-ratelimit sluice sluice-lease floor}"
echo
echo "envoyproxy/ratelimit $peer_version vs sluice; redis-server $(redis-server --version | cut -d' ' -f3) on 127.0.0.1:$redis_port"
if [ "$CLIENT" = h2load ]; then
	echo "load: h2load -t 1 -c $CONNS -m $((CALLERS / CONNS)) -D $DURATION (after a $WARMUP warm-up), one key (h2load posts one body); p50_ms is h2load's mean, p95/p99 are not measured"
else
	echo "load: sluice-load ${load_args[*]} -duration $DURATION (after a $WARMUP warm-up); policy: fixed window, $REQUESTS_PER_UNIT per $UNIT per user"
fi
echo "machine: $(nproc) cores shared by the load tool, the system under test and Redis; GOMAXPROCS of the systems: ${procs:-default}"
echo
printf '%-15s %4s %12s %9s %9s %9s %7s %13s %12s %12s\n' system run decisions/s p50_ms p95_ms p99_ms errors server_cpu_us redis_cpu_us cmd_usec
declare -A results
for run in $(seq "$RUNS"); do
	# Odd runs go in SYSTEMS' order, even runs in reverse (ABBA): this
	# machine's speed drifts during a set, and a fixed order would hand
	# the drift to whichever system always runs second.
	order=("${systems[@]}")
	if ((run % 2 == 0)); then
		order=()
		for ((i = ${#systems[@]} - 1; i >= 0; i--)); do
			order+=("${systems[i]}")
		done
	fi
	for sys in "${order[@]}"; do
		rcli FLUSHALL >/dev/null
		log="$work/$sys-$run.log"
		start_system "$sys" "$log"
		drive "$sys_addr" "$WARMUP" "$work/warmup.json" >/dev/null 2>&1 || true
		rcli CONFIG RESETSTAT >/dev/null
		cpu0=$(redis_cpu)
		srv0=$(proc_cpu "$sys_pid")
		out="$work/$sys-$run.json"
		drive "$sys_addr" "$DURATION" "$out" ||
			die "the load ($CLIENT) failed against $sys (run $run); see $out and $log"
		cpu1=$(redis_cpu)
		srv1=$(proc_cpu "$sys_pid")
		usec=$(redis_cmd_usec)
		cmds=$(redis_cmd_names)
		stop_pid "$sys_pid"
		dec=$(json_field "$out" decisions)
		rate=$(json_field "$out" decisions_per_second)
		p50=$(json_field "$out" p50_ms)
		p95=$(json_field "$out" p95_ms)
		p99=$(json_field "$out" p99_ms)
		p95=${p95:-nan} p99=${p99:-nan}
		errs=$(json_field "$out" errors)
		cpu_us=$(awk -v a="$cpu0" -v b="$cpu1" -v d="$dec" 'BEGIN { printf "%.2f", (b - a) * 1e6 / d }')
		cmd_us=$(awk -v u="$usec" -v d="$dec" 'BEGIN { printf "%.2f", u / d }')
		srv_us=$(awk -v a="$srv0" -v b="$srv1" -v d="$dec" 'BEGIN { printf "%.2f", (b - a) * 1e6 / d }')
		printf '%-15s %4s %12.0f %9.3f %9.3f %9.3f %7s %13s %12s %12s   %s\n' "$sys" "$run" "$rate" "$p50" "$p95" "$p99" "$errs" "$srv_us" "$cpu_us" "$cmd_us" "$cmds"
		results[$sys,rate]+="$rate "
		results[$sys,p50]+="$p50 "
		results[$sys,p95]+="$p95 "
		results[$sys,p99]+="$p99 "
		results[$sys,cpu]+="$cpu_us "
		results[$sys,srv]+="$srv_us "
		results[$sys,cmd]+="$cmd_us "
	done
done

# median prints the median of its arguments.
median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
declare -A med
{
	echo "medians of $RUNS runs:"
	printf '%-15s %12s %9s %9s %9s %13s %12s %12s\n' system decisions/s p50_ms p95_ms p99_ms server_cpu_us redis_cpu_us cmd_usec
	for sys in "${systems[@]}"; do
		for f in rate p50 p95 p99 srv cpu cmd; do
			# shellcheck disable=SC2086
			med[$sys,$f]=$(median ${results[$sys,$f]})
		done
		printf '%-15s %12.0f %9.3f %9.3f %9.3f %13.2f %12.2f %12.2f\n' "$sys" "${med[$sys,rate]}" "${med[$sys,p50]}" \
			"${med[$sys,p95]}" "${med[$sys,p99]}" "${med[$sys,srv]}" "${med[$sys,cpu]}" "${med[$sys,cmd]}"
	done
} >"$work/medians.txt"
cat "$work/medians.txt"
if [ -n "${CHART:-}" ]; then
	"$work/chart" -title "bench-rls, $CLIENT client, $(date -u +%Y-%m-%d), medians of $RUNS runs" -o "$CHART" <"$work/medians.txt"
	echo "chart: $CHART"
fi
[ -n "${med[sluice,rate]:-}" ] && [ -n "${med[ratelimit,rate]:-}" ] && awk -v s="${med[sluice,rate]}" -v r="${med[ratelimit,rate]}" -v sp="${med[sluice,p99]}" -v rp="${med[ratelimit,p99]}" \
	-v c="${med[sluice,cpu]}" -v cmd="${med[sluice,cmd]}" -v rc="${med[ratelimit,cpu]}" 'BEGIN {
	printf "sluice / envoyproxy/ratelimit: %.2fx decisions/s (goal >= 4x), p99 %.3f vs %.3f ms (goal <=)\n", s / r, sp, rp
	printf "Redis per decision: %.2f us in sluice'"'"'s script calls (INFO commandstats; goal <= 4); whole Redis CPU %.2f us against %.2f (%.2fx)\n", cmd, c, rc, c / rc
}'
[ -n "${med[sluice-lease,rate]:-}" ] && [ -n "${med[ratelimit,rate]:-}" ] && awk -v s="${med[sluice-lease,srv]}" -v sr="${med[sluice-lease,cpu]}" \
	-v r="${med[ratelimit,srv]}" -v rr="${med[ratelimit,cpu]}" -v sd="${med[sluice-lease,rate]}" -v rd="${med[ratelimit,rate]}" \
	-v sp="${med[sluice-lease,p99]}" -v rp="${med[ratelimit,p99]}" 'BEGIN {
	printf "sluice-lease / envoyproxy/ratelimit: CPU per decision (server + Redis) %.2f vs %.2f us = %.3f (goal <= 0.1); %.2fx decisions/s; p99 %.3f vs %.3f ms\n", s + sr, r + rr, (s + sr) / (r + rr), sd / rd, sp, rp
}'
[ -n "${med[floor,rate]:-}" ] && [ -n "${med[ratelimit,rate]:-}" ] && awk -v f="${med[floor,srv]}" -v r="${med[ratelimit,srv]}" \
	-v rr="${med[ratelimit,cpu]}" -v l="${med[sluice-lease,srv]:-0}" -v lr="${med[sluice-lease,cpu]:-0}" 'BEGIN {
	printf "transport floor (gRPC over HTTP/2 alone, no decision): %.2f us of server CPU per call = %.3f of envoyproxy/ratelimit'"'"'s server and Redis CPU", f, f / (r + rr)
	if (l > 0) printf "; sluice-lease spends %.2f us above it (server and Redis)", l + lr - f
	printf "\n"
}'
[ -n "${med[sluice,rate]:-}" ] && [ -n "${med[sluice-base,rate]:-}" ] && awk -v s="${med[sluice,rate]}" -v b="${med[sluice-base,rate]}" \
	-v sp="${med[sluice,p99]}" -v bp="${med[sluice-base,p99]}" -v base="$BASE" 'BEGIN {
	printf "sluice / sluice-base (%s): %.3fx decisions/s (%+.1f%%), p99 %.3f vs %.3f ms\n", base, s / b, 100 * (s / b - 1), sp, bp
}'
echo "(server_cpu_us: the system's own CPU (user + system, /proc) per decision; redis_cpu_us: INFO cpu used_cpu_sys+used_cpu_user delta per decision; cmd_usec: INFO commandstats usec of the commands clients sent, per decision)"
