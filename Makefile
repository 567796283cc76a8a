# Marquee: the two commands the README promises, and a few helpers.
.PHONY: run test test-deploy build lint format deps bench-pg-bulk bench-http bench-transport bench-fanout bench-latency chaos clean

## Build in release mode and run everything locally (private PostgreSQL under .data/).
run:
	@Deploy/local/run.sh

## Run the whole test suite against a throwaway PostgreSQL cluster.
test:
	@Deploy/local/test.sh

## Check Deploy/: image packages, kustomize, systemd units, promtool, a real Prometheus scrape.
test-deploy:
	@Deploy/test-deploy.sh

## Install missing Debian packages.
deps:
	@Deploy/local/deps.sh

build: deps
	swift build -c release

## swift format, strict: any finding fails.
lint:
	swift format lint --strict --recursive Package.swift Sources Tests bench

format:
	swift format --in-place --recursive Package.swift Sources Tests bench

bench-pg-bulk:
	@bench/pg-bulk/run.sh

bench-http:
	@bench/http/run.sh

## APNsProvider vs h2load vs aioapns against the APNs simulator (N=200000).
bench-transport:
	@bench/transport/run.sh

## End-to-end delivery of 100,000 updates (MODE=apns|fcm) vs pgbench running the claim + record SQL.
bench-fanout:
	@bench/fanout/run.sh

## API accept -> simulator receipt at 1,000 updates/s.
bench-latency:
	@bench/latency/run.sh

## Chaos scenarios (not part of `make test`): kill -9 of a worker, PostgreSQL restart, SIGTERM, provider faults.
chaos:
	@bench/chaos/run.sh

clean:
	rm -rf .build
