package config

// DefaultYAML is the default configuration with every key documented. It is
// what `mcp-sandboxd config default` prints and, byte for byte, what
// config/mcp-sandboxd.yaml holds; parsing it gives exactly Default(). Tests
// enforce both, so a key added to Config must be added here too.
const DefaultYAML = `# mcp-sandboxd configuration (default path: /etc/mcp-sandboxd/mcp-sandboxd.yaml).
#
# Every key is shown with its default value; a key left out keeps its default.
# Unknown keys and invalid values are errors that name the key.
#
# Every key can be overridden from the environment, which wins over this file:
# SANDBOXD_<SECTION>_<KEY> in upper case. Lists are comma-separated, maps are
# key=value pairs separated by commas:
#   SANDBOXD_SERVER_HTTP_ADDR=127.0.0.1:8080
#   SANDBOXD_SANDBOX_MEMORY=1G
#   SANDBOXD_NETWORK_DNS=1.1.1.1,9.9.9.9
#   SANDBOXD_SANDBOX_POOL=python=2,node=1
#
# Units. Sizes are bytes with an optional binary suffix: K, M, G, T
# (1K = 1024; KB and KiB mean the same). Durations are written like 30s, 5m,
# 1h30m; 0 means "never" where a key says so.
#
# Check a file with: mcp-sandboxd config validate FILE

server:
  # Unix socket of the REST API (used by sandboxctl). No authentication: the
  # socket's file mode is the access control.
  socket: /run/mcp-sandboxd/api.sock
  # Group that owns the socket. Members of the
  # group use the daemon without root, e.g. "mcp-sandboxd stdio" from their
  # own Claude Code. "make install" creates the group mcp-sandboxd; when the
  # group does not exist the socket stays root's (a warning is logged).
  socket_group: mcp-sandboxd
  # Permission bits of the socket (octal; root must keep read and write).
  socket_mode: "0660"
  # TCP address (host:port) serving MCP (/mcp), the REST API, /healthz,
  # /readyz, /metrics and the web editor (/; log in with the URL that
  # "sandboxctl ui" prints). Empty: no TCP listener.
  http_addr: 127.0.0.1:7070
  # File holding the bearer token required on every HTTP request except
  # /healthz and the web editor's login (absolute path; browsers use a
  # session cookie instead). Required when http_addr is set.
  auth_token_file: /etc/mcp-sandboxd/token
  # TCP address (host:port) of the preview listener: it serves the ports
  # of sandboxes exposed with sandbox_expose_port / "sandboxctl port" at
  # /preview/SANDBOX_ID/PORT/, each behind its own token (the answer's URL
  # carries it once, then a cookie does). Its own origin, apart from
  # http_addr. Port 0 picks a free port (the URLs say which). Empty: none.
  preview_listen: 127.0.0.1:7071
  # MCP tool groups offered to clients: sandbox, exec, files, run, images,
  # autofix, vm.
  tools: [sandbox, exec, files, run, images, autofix, vm]
  # Largest MCP tool result (structured and text parts together). Longer
  # command output is cut in the middle with a marker saying where the rest
  # is (the run record, a file, job_status offsets). The default keeps a
  # result well under Claude Code's 25,000-token limit (MAX_MCP_OUTPUT_TOKENS).
  mcp_max_result_bytes: 48K
  # What happens to the sandboxes an MCP session created when the session
  # ends (stdio client exits, HTTP session deleted or idle for an hour):
  # keep (they live on until their idle_timeout / ttl) or terminate.
  mcp_on_session_end: keep
  # How long an MCP tool call may stay silent before the client is told it
  # still runs: a progress notification when the client gave a progress
  # token, else (over HTTP) an SSE comment, which is the first byte clients
  # such as Claude Code wait for.
  mcp_progress_interval: 15s
  # Largest request body accepted, MCP requests included (a larger one is
  # refused with invalid_argument before it is read). Files larger than this
  # go through the REST upload (PUT /v1/sandboxes/{id}/files).
  max_request_bytes: 4M

# Directories and files (absolute paths).
paths:
  # Persistent state: the SQLite database, language images, run records.
  state_dir: /var/lib/mcp-sandboxd
  # Runtime state, normally on tmpfs: container state, sandbox mounts, the
  # daemon's lock.
  run_dir: /run/mcp-sandboxd
  # Language image recipes, one YAML file per language.
  recipes_dir: /usr/share/mcp-sandboxd/rootfs
  # Docker-format seccomp profiles (NAME.json).
  seccomp_dir: /usr/share/mcp-sandboxd/seccomp-profiles
  # The static sandbox-agent binary, mounted read-only as PID 1 of every
  # sandbox. sandbox-init, every container's runc init, is found beside it.
  agent_path: /usr/libexec/mcp-sandboxd/sandbox-agent
  # Built language images (content-addressed, read-only). Empty means
  # state_dir/images; point several state dirs at one store to share images.
  images_dir: ""
  # Image files (sparse ext4) of disk-backed sandboxes, one per sandbox,
  # attached to loop devices. Empty means state_dir/sandboxes.
  sandboxes_dir: ""

# Sandbox limits. A client may ask for any value up to the max_* cap; what it
# does not ask for gets the default.
sandbox:
  # Memory limit (size, at least 16M). There is no swap.
  memory: 512M
  max_memory: 4G
  # CPU quota (cores; fractions such as 0.5 allowed).
  cpus: 1
  max_cpus: 2
  # Maximum number of processes and threads (at least 16).
  pids: 256
  max_pids: 4096
  # Size of the writable layer over the read-only image (size, at least 16M):
  # everything a sandbox can write (/workspace, /tmp, changes to its root)
  # shares it, and a full disk fails with ENOSPC inside. Its inode limit is
  # one per 16K of disk unless sandbox_create asks for another.
  disk: 1G
  max_disk: 8G
  # Where a sandbox's writable file system lives unless sandbox_create says
  # otherwise: disk (a sparse ext4 image in paths.sandboxes_dir on a loop
  # device; page cache, not counted as memory) or memory (a tmpfs: fastest,
  # but every byte written counts against the sandbox's memory limit).
  disk_backing: disk
  # Time limit of one command (duration, at least 1s); on expiry its whole
  # process group is killed.
  exec_timeout: 5m
  max_exec_timeout: 1h
  # Terminate a sandbox that has been ready with no command running for this
  # long (duration; 0: never).
  idle_timeout: 30m
  # Terminate a sandbox this long after its creation, whatever it is doing
  # (duration; 0: never).
  max_lifetime: 24h
  # Sandboxes that may exist at once, warm ones included and terminated ones
  # not (count, at least 1).
  max_sandboxes: 32
  # Output kept per stream (stdout, stderr) of one command (size, at least
  # 1K); a command that writes more ends with termination cause output_limit.
  output_limit: 16M
  # uid and gid that commands run as inside the sandbox (1 to 65535; never 0).
  user: 1000
  # Seccomp profile: a file name in paths.seccomp_dir without ".json", or
  # "unconfined" to run sandboxes without seccomp (not recommended).
  seccomp_profile: default
  # Rules added to a profile without copying it (profile name → rules); a
  # rule replaces every rule of the profile for the syscalls it names.
  # Creates may pick another profile of seccomp_dir (seccomp_profile), e.g.
  # "strict". Example: {default: [{names: [ptrace], action: SCMP_ACT_ERRNO, errno_ret: 1}]}
  seccomp_rules: {}
  # Report the syscalls seccomp refused a command (blocked_syscalls in its
  # result: name and count), through a seccomp notification listener per
  # sandbox. Allowed syscalls cost nothing; a refused one costs a round trip
  # to the daemon.
  seccomp_diagnostics: true
  # Landlock behind the namespaces and seccomp: each sandbox's agent
  # confines itself and every command to the paths the sandbox's spec
  # declares (its root and mounts); a mount it does not declare is refused.
  # auto: where the kernel has Landlock ABI 2 or later; require: the daemon
  # refuses to start without it; off.
  landlock: auto
  # Warm sandboxes kept ready per language (count), e.g. {python: 2, node: 1}.
  # They count towards max_sandboxes.
  pool: {}
  # Parent cgroup of every sandbox (absolute cgroup path, not "/").
  cgroup_parent: /mcp-sandboxd
  # Set favordynmods (kernel 6.0+) on the host's cgroup2 hierarchy at start.
  # Every command enters a cgroup of its own; without the option such a
  # move can wait for an RCU grace period (ms each; exec of true: 14 -> 7 ms
  # measured under load). It is host-wide and makes forks and exits a little
  # dearer; the daemon never clears it. false leaves the mount alone.
  cgroup_favordynmods: true
  # Block I/O read throttle per sandbox, in bytes per second (size; 0: none),
  # on the block device that holds the images: reads of the image layers.
  # Applied where the io (v2) or blkio (v1) controller exists.
  io_read_bps: 0
  # Block I/O write throttle on the same device (size; 0: none). A sandbox's
  # own files live on its loop device or tmpfs, bounded by its disk limit.
  io_write_bps: 0
  # Every sandbox runs in its own user namespace, with its own range of
  # unprivileged host uids and gids: ids 0..size-1 inside are
  # base+n*size.. on the host for the sandbox holding range n (allocations
  # are kept in the database; a range is handed out again only after every
  # process and file of its last holder is gone). The default pool
  # (0x70000000, 2048 ranges of 65536) lies above the ranges /etc/subuid
  # and systemd hand out and below 2^31; the daemon refuses to start if an
  # account of /etc/passwd or group of /etc/group falls in it. count 0 runs
  # sandboxes without a user namespace (needed on kernels before 5.19, whose
  # overlayfs cannot use idmapped layers).
  userns_pool:
    # First host uid/gid of the pool.
    base: 1879048192
    # Ids per sandbox (at least 65535: inside ids 0 to nobody).
    size: 65536
    # Ranges, so sandboxes at once (at least max_sandboxes); 0: no user
    # namespaces.
    count: 2048

network:
  # Bridge that sandboxes with network access are attached to (interface
  # name, at most 15 characters).
  bridge: sbx0
  # IPv4 subnet of sandbox addresses (CIDR); the bridge takes the first
  # address.
  subnet: 10.88.0.0/16
  # Network of a sandbox that does not ask for one: none (loopback only),
  # egress (NAT to the outside, minus deny), allowlist (only the hosts given
  # when the sandbox is created).
  default_mode: none
  # Destinations (CIDRs) no sandbox can reach, whatever its mode: private
  # ranges, link-local (cloud metadata), carrier-grade NAT, the host itself.
  deny:
    - 10.0.0.0/8
    - 172.16.0.0/12
    - 192.168.0.0/16
    - 169.254.0.0/16
    - 100.64.0.0/10
    - 127.0.0.0/8
    - fc00::/7
    - fe80::/10
    - ::1/128
  # Upstream DNS servers of the forwarder on the gateway that sandboxes
  # resolve through (IP addresses). Empty: the host's /etc/resolv.conf.
  dns: []
  # MTU of the bridge and the sandboxes' veths. 0: the kernel's default.
  mtu: 0
  # Default bandwidth of a sandbox with network, bytes per second in each
  # direction (size; 0: unlimited), and the most a sandbox may ask for.
  bandwidth: 0
  max_bandwidth: 0
  # Default limit of new connections per second a sandbox opens (0:
  # unlimited), and the most a sandbox may ask for.
  conn_rate: 0
  max_conn_rate: 0
  # How long the DNS forwarder holds an allowlist sandbox's lookup of a
  # refused name while the MCP client running the call is asked whether to
  # allow it (1s to 40s; sandboxes' resolv.conf lets glibc wait 50s).
  approval_hold: 30s
  # Named allowlists a sandbox's allow list can use as "@name", e.g.
  # python: [pkgs.example.org, "*.files.example.org"]. Entries are host
  # names, *.domain wildcards and IPv4 CIDRs.
  presets: {}
  # Package indexes and mirrors sandboxes install from, passed as the
  # package managers' usual environment variables. Empty: their defaults.
  package_indexes:
    # pip index URL (PIP_INDEX_URL; an http:// index is also trusted).
    pip_index_url: ""
    # npm registry URL (NPM_CONFIG_REGISTRY).
    npm_registry: ""
    # Go module proxy (GOPROXY).
    go_proxy: ""
  # Upstream APIs whose secret the daemon adds at the egress: a sandbox
  # created with credentials: [NAME] reaches http://GATEWAY:PORT/NAME/TOKEN
  # (TOKEN: per sandbox) through its BASE_URL variable and never holds the
  # secret. Per entry: base_url (upstream), header (e.g. x-api-key),
  # header_prefix (e.g. "Bearer "), secret_env or secret_file (the
  # daemon's), base_url_env and key_env (the sandbox's variables, e.g.
  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY), max_requests and max_tokens
  # (spend caps per sandbox; 0: none). See docs/agents.md.
  credentials: {}
  # TCP port of the credential proxy on the gateway.
  credential_port: 8119

# Language images.
images:
  # Debian mirror (http:// or https:// URL) images are built from. Empty: the
  # mirror in the host's apt sources.
  mirror: ""
  # Debian suite for recipes that do not name one.
  suite: bookworm
  # Enabled languages (recipe names in paths.recipes_dir). Empty: all.
  languages: []
  # Build an image that is not built yet when a sandbox or run_code first
  # asks for it (one build per image at a time; concurrent callers wait for
  # it; run_code streams the build's phases as progress). false: such
  # requests fail as unavailable, for hosts that must only run prebuilt
  # images (mcp-sandboxd images build NAME).
  build_on_demand: true
  # Remove stale images (trees of an older digest of a recipe, kept while
  # sandboxes started on them live) that no sandbox of this daemon uses, at
  # start and after each build; sandboxctl images prune does it on demand.
  # Off by default: a store shared by several daemons (paths.images_dir) may
  # hold trees another daemon's sandboxes still run on.
  prune_stale: false
  # OCI images (image_pull, sandboxctl images pull/import). Registries a
  # sandbox_create {image: "registry/name:tag"} may pull from on first use
  # (host[:port], or "*" for any); empty: only an explicit pull brings one.
  allow_pull: []
  # Cap on an OCI image's unpacked layers (a decompression bomb stops here).
  max_size: 8GiB
  # Cap on an OCI manifest, index or config.
  max_manifest_size: 4MiB
  # Registry credentials and CAs, e.g.
  #   - host: registry.example:5000
  #     username: builder
  #     password_env: REGISTRY_PASSWORD   # or password:, or token:
  #     ca_file: /etc/sandboxd/registry-ca.pem
  registries: []
  # A Docker config.json whose "auths" serve registries not listed above.
  docker_config: ""
  # Registries (host or host:port) a non-admin key may pull from although
  # they resolve to a non-public address (private, loopback, link-local,
  # CGNAT, ULA, ...). Those of registries: above may be too. Every other
  # pull of a non-admin key (image_pull, sandbox_create or template_create
  # with a reference, a Dockerfile's FROM) connects only to public
  # addresses, redirects included; admin keys are not restricted.
  private_registries: []

# Run records: one directory per run_code (and autofix) call, with the code,
# the full logs, the sandbox's description, metadata and output files.
runs:
  # Directory of the records (absolute path). Empty: state_dir/runs.
  dir: ""
  # Records older than this are deleted (duration; 0: never).
  max_age: 720h
  # When the records together exceed this size the oldest are deleted (size;
  # 0: no limit).
  max_total_size: 10G
  # Output kept per stream in a record's stdout.log and stderr.log (size, at
  # least 1K), however little of it the caller's answer carries.
  log_cap: 64M

# Workspace snapshots (sandbox_snapshot, sandbox_restore, sandbox_create
# from_snapshot): a sandbox's /workspace, /tmp and root file system layer as
# a zstd-compressed tar named by its sha256.
snapshots:
  # Directory of the archives (absolute path). Empty: state_dir/snapshots.
  dir: ""
  # Snapshots older than this are deleted (duration; 0: never).
  max_age: 168h
  # Cap on one snapshot's compressed size (size; 0: none). A larger one
  # fails with limit_exceeded and leaves nothing behind.
  max_size: 2G

# Named volumes (volume_create, sandbox_create volumes): disk that outlives
# sandboxes, each an ext4 image with a journal on a loop device, mounted into
# sandboxes at a path, read-write or read-only, by several at once. They
# survive restarts and kill -9; gc never removes one.
volumes:
  # Directory of the volume images (absolute path). Empty: state_dir/volumes.
  dir: ""
  # Size of a volume created without size_mb (size).
  default_size: 1G
  # Cap on one volume's size (size, at least 16M).
  max_size: 64G
  # Volumes at once (0: no cap); beyond, volume_create is limit_exceeded.
  max_volumes: 256
  # Volumes one sandbox may mount.
  max_per_sandbox: 8

# Lifecycle webhooks (docs/webhooks.md): signed POSTs of sandbox, run,
# autofix, quota and node events to URLs each tenant registers, retried
# with backoff from a queue in the state database.
webhooks:
  # Networks (CIDRs) of private, loopback or link-local addresses any
  # caller's webhook may reach. Outside them such an address needs a hook
  # registered by an admin key.
  allow_private: []
  # The first retry's delay; each further one doubles, up to retry_max,
  # with jitter (duration, at least 100ms).
  retry_base: 5s
  # The longest delay between two attempts (duration).
  retry_max: 1h
  # Attempts of one delivery before it is given up (it can be redelivered).
  max_attempts: 8
  # Failed attempts in a row after which the webhook is disabled.
  disable_after: 20
  # Deliveries older than this leave the delivery log (duration).
  max_age: 168h
  # Webhooks per tenant.
  max_webhooks: 32

# The run, fix, run again loop.
autofix:
  # Who writes the fixes by default: client (the calling MCP client,
  # through autofix_submit), sampling (the MCP client's model, through
  # sampling/createMessage; client when the client cannot sample),
  # anthropic (the Anthropic API), command (a program) or agent (a Claude
  # Code session in the loop's sandbox, agent image, the key added by the
  # credential proxy: network.credentials.anthropic). A call may pick
  # another provider that is configured (anthropic: a key; command: a
  # command line; agent: the credential).
  provider: client
  # Fix requests after the first run (count, 1 to max_retries_cap); a loop
  # runs the program at most max_retries + 1 times.
  max_retries: 5
  # Largest max_retries a call may ask for (count, at most 20).
  max_retries_cap: 20
  # Time limit of one whole autofix loop, all attempts and fixes included
  # (duration). The client provider's thinking time does not count.
  timeout: 300s
  # Largest timeout a call may ask for (duration).
  max_timeout: 1800s
  # When a run counts as fixed: exit_zero_and_empty_stderr, exit_zero or
  # tests (the language's test task must pass too).
  success: exit_zero_and_empty_stderr
  # client: how long a loop waiting for autofix_submit is kept (duration);
  # then it expires and its sandbox is removed.
  session_ttl: 1h
  # anthropic: max_tokens of each request (count).
  max_tokens: 8192
  # command: time limit of one call of the fixer program (duration).
  command_timeout: 120s
  # anthropic: model name. Empty: the provider's default.
  model: ""
  # anthropic: API base URL. Empty: the provider's default.
  base_url: ""
  # anthropic: name of the environment variable holding the API key.
  api_key_env: ANTHROPIC_API_KEY
  # anthropic: file holding the API key (absolute path); when set it is used
  # instead of api_key_env.
  api_key_file: ""
  # command: the fixer program and its arguments, e.g. [/usr/local/bin/fixer].
  command: []

# Virtual machines.
vm:
  # QEMU system emulator: a program name looked up in PATH, or an absolute
  # path.
  qemu: qemu-system-x86_64
  # Accelerator: kvm, tcg (software emulation, slow) or auto (kvm when
  # /dev/kvm is usable, else tcg).
  accel: auto
  # Administrator-prepared guest disk per OS (absolute paths, qcow2), e.g.
  # {windows: /var/lib/mcp-sandboxd/vm/windows.qcow2}; Windows VMs need one.
  # Such a disk boots through its own boot loader (Windows: q35, OVMF with
  # Secure Boot, a TPM 2.0; linux: q35, OVMF without Secure Boot) and must
  # run the QEMU guest agent: exec_command and file_* go through it. Without a
  # linux entry, Linux VMs boot the built Linux guest (images build --vm
  # linux) with the sandbox agent. See README, "Windows guests".
  images: {}
  # Virtual machines that may run at once (count; 0 disables VMs). A VM's
  # memory and vCPUs are capped by sandbox.max_memory and sandbox.max_cpus.
  max_vms: 2
  # How long a VM of an administrator's disk may boot until its QEMU guest
  # agent answers (duration). Windows under software emulation (tcg) takes
  # minutes.
  boot_timeout: 15m

# The E2B-compatible API: the official E2B SDKs (and the agent frameworks
# built on them) use the daemon when E2B_API_URL and E2B_SANDBOX_URL name
# e2b.listen and E2B_API_KEY is one of the keys (README, "Using the E2B SDKs").
e2b:
  # TCP address (host:port) of the E2B listener: control plane, envd data
  # plane (routed by the E2b-Sandbox-Id header, or by host name) and
  # sandbox ports. Empty: off.
  listen: ""
  # File of API keys, one per line: e2b_ followed by hex digits (the form
  # the SDKs accept), e.g. "e2b_$(openssl rand -hex 20)". Required with
  # listen.
  api_key_file: /etc/mcp-sandboxd/e2b-keys
  # Domain of host-name routing: {port}-{sandboxID}.{domain} reaches port
  # {port} of a sandbox (49983: its envd), for sandbox.getHost() and signed
  # file URLs. Needs a wildcard DNS record for *.{domain}. Empty: header
  # routing only.
  domain: ""
  # PEM certificate (absolute path) to serve listen over TLS, e.g. a
  # wildcard certificate for *.{domain}. Empty: plain HTTP.
  tls_cert: ""
  # PEM private key of tls_cert (absolute path; both or neither).
  tls_key: ""

audit:
  # The audit log: one JSON line per authentication failure and per call
  # that changes anything (who, what, target, outcome, source, front end,
  # time), each carrying the hash of the one before; written and fsynced
  # before the call is answered. Check it with "sandboxctl audit verify".
  enabled: true
  # Directory of the log's files (absolute path). Empty: STATE_DIR/audit.
  dir: ""
  # Rotate the current file at this size; the chain runs on.
  max_file_bytes: 64M
  # Rotate the current file once its first record is this old.
  max_file_age: 24h
  # Delete the oldest files while all of them are larger (0: no limit).
  max_total_bytes: 1G
  # Delete files whose last record is older than this (0: keep them).
  retention_age: 2160h
  # Store the newest record's hash in the state database after this many
  # records (and every 10 seconds of activity): a rewritten or cut chain
  # disagrees with it.
  checkpoint_every: 256
  # Verify the whole chain at start and then this often; the result is the
  # sandboxd_audit_chain_ok gauge that deploy/prometheus alerts on
  # (0: only when asked, by "sandboxctl audit verify").
  verify_interval: 1h

# The SSH endpoint: ssh, scp, sftp, rsync and editors' remote-SSH reach a
# sandbox as user <sandbox id> (<sandbox id>+root for root mode), with a key
# registered by "sandboxctl ssh-keys add" or a token "sandboxctl ssh" mints
# (README, "SSH access"). The host key is generated once, as
# ssh_host_ed25519_key in paths.state_dir.
ssh:
  # TCP address (host:port) of the SSH endpoint. Empty: off.
  listen: ""
  # How often an idle client is checked (duration); three unanswered checks
  # end the connection. 0: never.
  keepalive: 30s
  # How long a minted token stays valid (duration, at most 1h); a token is
  # also single-use.
  token_ttl: 5m

# The fleet's shared store. The daemon's own state is always state.db in
# paths.state_dir; several daemons and gateways that must share API keys
# (created, rotated and revoked through any of them, seen by all at once)
# name one PostgreSQL database here (docs/ARCHITECTURE.md, "The store
# seam").
store:
  # postgres:// URL, e.g. postgres://sandboxd@db.example/sandboxd or
  # postgres:///sandboxd?host=/run/postgresql. Empty: the keys stay in
  # state.db. Keep the password out of it (PGPASSWORD or ~/.pgpass).
  postgres_url: ""

# This daemon as one node of a fleet behind gateways (docs/ARCHITECTURE.md,
# "Gateway").
node:
  # Name of this node in the fleet: [a-z0-9-], at most 63. Non-empty, it is
  # written into every new sandbox id so that gateways route without a
  # lookup. Empty: a lone daemon.
  name: ""
  # File holding the secret gateways present when they forward a caller
  # they authenticated. Empty: no gateway is trusted.
  gateway_secret_file: ""

# mcp-sandboxd gateway: the stateless front of a fleet of node daemons.
gateway:
  # TCP address (host:port) the gateway serves REST on.
  listen: 127.0.0.1:7080
  # Static node list: each with name (its node.name) and url
  # (http://host:port of its server.http_addr).
  nodes: []
  # Secret shared with the nodes' node.gateway_secret_file.
  secret_file: /etc/mcp-sandboxd/gateway-secret
  # Admin key of the gateway's callers (created on first start).
  auth_token_file: /etc/mcp-sandboxd/gateway-token
  # Tenants store the gateways share.
  state_db: /var/lib/mcp-sandboxd/gateway.db
  # How long a call that asks every node waits for one (duration).
  node_timeout: 2s
  # Kubernetes discovery instead of nodes: the node daemons' headless
  # Service, read through the Kubernetes API (the Helm chart sets it).
  kubernetes:
    # Namespace of the Service (a DNS label).
    namespace: ""
    # Name of the Service. Empty: the static nodes list above.
    service: ""
    # Name of the Service's port that serves the daemons' REST API.
    port_name: ""
  # How old the nodes' capacity may grow before a placement renews it in
  # the background (duration); each gateway counts its own placements in
  # between.
  probe_interval: 250ms
  # With store.postgres_url: how often the gateway releases the fleet
  # quota counts of sandboxes that ended on their nodes (duration).
  reconcile_interval: 10s
  # Serve the E2B API here (host:port), routed to the nodes' e2b
  # listeners. Empty: no E2B through this gateway.
  e2b_listen: ""
  # Host-name routing domain of the E2B data plane ({port}-{id}.{domain}).
  e2b_domain: ""
  # Serve preview URLs here (host:port), routed to the nodes' preview
  # listeners. Empty: none.
  preview_listen: ""
  # The address callers reach preview_listen at (http:// or https://, e.g.
  # a load balancer's); exposures made through the gateway name it.
  # Empty: the listener's own address.
  preview_url: ""

log:
  # Least severe level logged: debug, info, warn or error.
  level: info
  # text (for people) or json (one object per line, for log collectors).
  format: text

# Distributed traces (OpenTelemetry): a span for every request from the
# front end through the services to the sandbox's agent, exported over OTLP
# (docs/SPEC.md, "Traces"). A caller's W3C traceparent (HTTP header, or an
# MCP request's params._meta) parents them.
telemetry:
  # The collector's URL, e.g. http://127.0.0.1:4318 (http/protobuf; the
  # path /v1/traces is added when there is none) or http://127.0.0.1:4317
  # (grpc); https:// for TLS. Empty: tracing off, at no cost.
  otlp_endpoint: ""
  # http/protobuf or grpc.
  otlp_protocol: http/protobuf
  # Headers sent with every export, e.g. a hosted collector's API key
  # ({"x-api-key": "..."}); never logged.
  otlp_headers: {}
  # Share of new traces recorded, 0 to 1; a caller's traceparent decides
  # for its own trace.
  sample_ratio: 1
  # The service.name of the spans.
  service_name: mcp-sandboxd
`
