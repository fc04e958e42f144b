# rvbpfd container image (multi-stage, Debian 12). Run with the host's pid namespace and BPF privileges, e.g.
#   docker run --rm --pid=host --privileged -v /sys/kernel:/sys/kernel:ro -v "$PWD:/out" rvbpfd --pid 1234 -o /out/x.rvtrace
# (--privileged can be narrowed to --cap-add BPF --cap-add PERFMON --cap-add SYS_PTRACE --cap-add SYS_RESOURCE.)
#
# The fleet agent (docs/deploy.md explains each option):
#   docker run -d --name rvbpfd-agent --restart unless-stopped --pid=host --cgroupns=host \
#     --cap-drop ALL --cap-add BPF --cap-add PERFMON --cap-add SYS_PTRACE --cap-add DAC_READ_SEARCH \
#     --cap-add SYS_RESOURCE --security-opt apparmor=unconfined --read-only \
#     -v /var/cache/rvbpfd:/var/cache/rvbpfd -p 127.0.0.1:9464:9464 \
#     rvbpfd agent --push-url http://pyroscope.example:4040 --metrics-listen 0.0.0.0:9464 --host "$(hostname)"
# (0.0.0.0 is the container's own network namespace; -p publishes it on the host's loopback only.)
FROM debian:bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      build-essential cmake pkg-config clang llvm bpftool libbpf-dev libelf-dev libdw-dev libcapstone-dev \
      libcli11-dev libgtest-dev libgmock-dev zlib1g-dev libzstd-dev nlohmann-json3-dev libcurl4-openssl-dev \
      libdebuginfod-dev \
      python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# vmlinux.h comes from the build host's BTF (/sys/kernel/btf/vmlinux); BPF CO-RE relocates it to the run host's kernel.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j"$(nproc)" --target rvbpfd

FROM debian:bookworm-slim
# libcurl4 and ca-certificates: the agent pushes profiles over HTTP(S) (--push-url); libdebuginfod1: debug files of
# stripped Rubies by build-id (DEBUGINFOD_URLS). Both are opened only when used (src/common/shared_library.h).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libbpf1 libelf1 libdw1 libcapstone4 zlib1g \
      libzstd1 \
      libcurl4 libdebuginfod1 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/rvbpfd /usr/sbin/rvbpfd
ENTRYPOINT ["/usr/sbin/rvbpfd"]
