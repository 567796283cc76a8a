#!/bin/bash
# Container health check without curl: GET /healthz over bash's /dev/tcp on the port of the command PID 1 runs
# (`serve`: MARQUEE_LISTEN, `worker`: MARQUEE_METRICS_LISTEN). One-shot commands are always healthy.
set -u
command=$(tr '\0' ' ' </proc/1/cmdline 2>/dev/null)
case "$command" in
  *" serve"*) listen=${MARQUEE_LISTEN:-:8080} ;;
  *" worker"*) listen=${MARQUEE_METRICS_LISTEN:-:9464} ;;
  *) exit 0 ;;
esac
port=${listen##*:}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
IFS= read -r -t 2 status <&3 || exit 1
case "$status" in
  "HTTP/1."?" 200"*) exit 0 ;;
  *) exit 1 ;;
esac
