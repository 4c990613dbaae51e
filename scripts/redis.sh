#!/usr/bin/env bash
# Start or stop a throwaway redis-server on loopback for the redis tier and its tests.
#
#   scripts/redis.sh start [PORT]   install redis-server if missing, start it, wait for PONG
#   scripts/redis.sh stop  [PORT]   stop it
#
# Both are idempotent. PORT defaults to 6390. No persistence (--save '' --appendonly no);
# pidfile and log under /tmp.
set -euo pipefail

cmd="${1:-}"
port="${2:-6390}"
pidfile="/tmp/kvmap-redis-${port}.pid"
logfile="/tmp/kvmap-redis-${port}.log"

ping() { redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; }

install() {
  command -v redis-server >/dev/null && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y redis-server
}

start() {
  install
  if ping; then echo "redis already answering on 127.0.0.1:${port}"; return 0; fi
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$pidfile" --logfile "$logfile"
  for _ in $(seq 1 100); do
    if ping; then echo "redis started on 127.0.0.1:${port} (pid $(cat "$pidfile"))"; return 0; fi
    sleep 0.1
  done
  echo "redis did not answer on 127.0.0.1:${port} within 10 s; see ${logfile}" >&2
  exit 1
}

stop() {
  if ping; then redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true; fi
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    # only if that pid is still a redis-server (pids get reused)
    if ps -p "$pid" -o comm= 2>/dev/null | grep -q redis; then kill "$pid"; fi
    rm -f "$pidfile"
  fi
  echo "redis on 127.0.0.1:${port} stopped"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop [PORT]" >&2; exit 2 ;;
esac
