#!/usr/bin/env bash
# A real two-node launch on one machine: two network namespaces joined by a veth pair, one
# megatron_launch per "node" (2 ranks each), rendezvous over 10.231.x.1. Needs root and
# `ip netns`; prints SKIP and exits 77 (ctest: skipped) where namespaces cannot be created (unprivileged CI).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
A=mdta$$ B=mdtb$$ NET=10.231.$(( $$ % 200 + 20 ))
if [ "$(id -u)" != 0 ] || ! ip netns add $A 2>/dev/null; then
  echo "SKIP: needs root and 'ip netns' (network namespaces)"; exit 77
fi
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$LOGDIR"; }
trap cleanup EXIT
ip netns add $B || fail "ip netns add"
ip link add va$$ type veth peer name vb$$ || fail "ip link add veth"
ip link set va$$ netns $A && ip link set vb$$ netns $B || fail "move veth"
ip -n $A addr add $NET.1/24 dev va$$ && ip -n $B addr add $NET.2/24 dev vb$$ || fail "addr"
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set va$$ up && ip -n $B link set vb$$ up || fail "link up"
port=$(free_port)
i=0
for ns in $A $B; do
  MEGATRON_TEST_EXPECT_BACKEND=tcp timeout 300 ip netns exec $ns "$BIN/megatron_launch" --nnodes 2 --node-rank $i \
    --nproc-per-node 2 --master-addr $NET.1 --master-port $port \
    "$BIN/unit_tests" --gtest_filter='DistCollectives*' --gtest_color=no >"$LOGDIR/node$i.log" 2>&1 &
  eval pid$i=$!
  i=$((i + 1))
done
wait $pid0 || { tail -30 "$LOGDIR/node0.log" >&2; fail "node 0 failed"; }
wait $pid1 || { tail -30 "$LOGDIR/node1.log" >&2; fail "node 1 failed"; }
expect_passed "$LOGDIR/node0.log" 11 2
expect_passed "$LOGDIR/node1.log" 11 2
echo "two namespaces x two ranks: all collectives pass"
