package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// SSH access through the daemon's SSH endpoint (ssh.listen; README "SSH
// access"): ssh-keys manages the public keys that may log in, ssh mints a
// single-use token and runs OpenSSH's ssh with it, ssh-config prints Host
// blocks for ssh, scp, rsync and editors.

// askpassEnv marks a run of sandboxctl as ssh's SSH_ASKPASS helper: ssh
// runs it for the endpoint's keyboard-interactive "token:" prompt, and it
// prints the token `sandboxctl ssh` left in tokenEnv. The token never
// appears on a command line (where ps would show it).
const (
	askpassEnv = "SANDBOXCTL_SSH_ASKPASS"
	tokenEnv   = "SANDBOXCTL_SSH_TOKEN"
)

// askpass answers ssh's prompt when sandboxctl runs as SSH_ASKPASS; it
// reports whether it did.
func askpass(stdout io.Writer) bool {
	if os.Getenv(askpassEnv) != "1" {
		return false
	}
	fmt.Fprintln(stdout, os.Getenv(tokenEnv))
	return true
}

// sshHost is the host:port ssh connects to: the endpoint's address, with
// an unspecified host replaced by the host sandboxctl reaches the daemon
// at (--url) or the loopback (the socket).
func sshHost(listen, apiURL string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(listen)
	if err != nil {
		return "", "", fmt.Errorf("ssh endpoint %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if u, perr := url.Parse(apiURL); perr == nil && apiURL != "" && u.Hostname() != "" {
			host = u.Hostname()
		}
	}
	return host, port, nil
}

// knownHostsAlias is the name the endpoint's host key is recorded under
// (HostKeyAlias), whatever address reaches it.
const knownHostsAlias = "mcp-sandboxd"

func writeKnownHosts(path, hostKey string) error {
	if hostKey == "" {
		return errors.New("the daemon sent no host key")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(knownHostsAlias+" "+hostKey+"\n"), 0o600)
}

func sshCmd(g *globals) *cobra.Command {
	var (
		root   bool
		ttl    time.Duration
		sshBin string
		proxy  bool
	)
	cmd := &cobra.Command{
		Use:   "ssh ID [-- SSH_ARGS... [COMMAND...]]",
		Short: "Log in to a sandbox with OpenSSH's ssh and a single-use token",
		Long: "ssh ID mints a token for one login to sandbox ID (single-use, and expiring after --ttl,\n" +
			"default the daemon's ssh.token_ttl) and runs ssh with it against the daemon's SSH endpoint,\n" +
			"checking the endpoint's host key. Arguments after -- go to ssh: options, then a command\n" +
			"(sandboxctl ssh ID -- -L 8080:localhost:8080, sandboxctl ssh ID -- ls /workspace).\n" +
			"The exit code is ssh's: the command's, or 255 when the connection failed.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req := apitypes.SSHTokenRequest{SandboxID: args[0], Root: root, TTLSeconds: ttl.Seconds()}
			tok, err := c.SSHToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			host, port := knownHostsAlias, "22" // ProxyCommand ignores them
			if !proxy {
				if host, port, err = sshHost(tok.Listen, g.url); err != nil {
					return err
				}
			}
			dir, err := os.MkdirTemp("", "sandboxctl-ssh-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			kh := filepath.Join(dir, "known_hosts")
			if err := writeKnownHosts(kh, tok.HostKey); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			argv := sshArgs(g, self, tok.User, port, kh, proxy, args[0])
			// OpenSSH reads options after the destination too, up to the
			// first argument that is not one (the remote command).
			argv = append(argv, host)
			argv = append(argv, args[1:]...)
			sc := exec.CommandContext(cmd.Context(), sshBin, argv...)
			sc.Stdin, sc.Stdout, sc.Stderr = os.Stdin, g.stdout, g.stderr
			sc.Env = append(os.Environ(), askpassEnv+"=1", tokenEnv+"="+tok.Token, "SSH_ASKPASS="+self, "SSH_ASKPASS_REQUIRE=force")
			if proxy && g.token != "" {
				// The ProxyCommand's API key, never on its command line.
				sc.Env = append(sc.Env, "SANDBOXD_TOKEN="+g.token)
			}
			err = sc.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return &exitStatus{code: ee.ExitCode()}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&root, "root", false, "log in as root (uid 0; root-mode sandboxes only)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the token stays valid if unused (default: the daemon's ssh.token_ttl)")
	cmd.Flags().StringVar(&sshBin, "ssh", "ssh", "the ssh program to run")
	cmd.Flags().BoolVar(&proxy, "proxy", false, "reach the SSH endpoint through the API (sandboxctl ssh-proxy), e.g. through a gateway")
	return cmd
}

// sshArgs are ssh's options for a token login as user: the endpoint's
// host key only (from the temporary known_hosts kh), keyboard-interactive
// with the token, no forwarding of the agent or X11; with proxy, the
// connection goes through the API (sandboxctl ssh-proxy) to sandbox id.
func sshArgs(g *globals, self, user, port, kh string, proxy bool, id string) []string {
	argv := []string{"-p", port, "-l", user,
		"-o", "UserKnownHostsFile=" + kh, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "HostKeyAlias=" + knownHostsAlias, "-o", "StrictHostKeyChecking=yes",
		"-o", "PreferredAuthentications=keyboard-interactive", "-o", "NumberOfPasswordPrompts=1",
		"-o", "ForwardAgent=no", "-o", "ForwardX11=no"}
	if proxy {
		// Through the API to the sandbox's path: a gateway routes
		// it to the node that minted the token.
		// Without the askpass marks, which would make it the
		// askpass helper, and without the login token.
		argv = append(argv, "-o", "ProxyCommand=env -u "+askpassEnv+" -u "+tokenEnv+" "+shellQuote(self)+g.apiFlags()+" ssh-proxy --sandbox "+shellQuote(id))
	}
	return argv
}

func sshKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ssh-keys",
		Short: "Manage the public keys that may log in to sandboxes over SSH",
	}
	cmd.AddCommand(sshKeysAddCmd(g), sshKeysListCmd(g), sshKeysRmCmd(g))
	return cmd
}

// sshKeysAddCmd is the add subcommand of sshKeysCmd.
func sshKeysAddCmd(g *globals) *cobra.Command {
	var name string
	add := &cobra.Command{
		Use:   "add [--name NAME] FILE|-",
		Short: "Register a public key (a .pub file, or - for stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var data []byte
			if args[0] == "-" {
				data, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return errdefs.Invalidf("public_key: %v", err)
			}
			n := name
			if n == "" {
				// The key's comment (user@host), else the file name.
				if f := strings.Fields(string(data)); len(f) >= 3 {
					n = f[2]
				} else {
					n = filepath.Base(args[0])
				}
			}
			k, err := c.AddSSHKey(cmd.Context(), apitypes.SSHKeyAddRequest{Name: n, PublicKey: string(data)})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(k)
			}
			fmt.Fprintf(g.stdout, "%s\t%s\t%s\n", k.ID, k.Fingerprint, k.Name)
			return nil
		},
	}
	add.Flags().StringVar(&name, "name", "", "a label for the key (default: its comment)")
	return add
}

// sshKeysListCmd is the list subcommand of sshKeysCmd.
func sshKeysListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the registered keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ks, err := c.SSHKeys(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(ks)
			}
			for _, k := range ks {
				fmt.Fprintf(g.stdout, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Type, k.Fingerprint, k.Name, k.CreatedAt.Format(time.RFC3339))
			}
			return nil
		},
	}
}

// sshKeysRmCmd is the rm subcommand of sshKeysCmd.
func sshKeysRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID|FINGERPRINT",
		Short: "Remove a key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.RemoveSSHKey(cmd.Context(), args[0])
		},
	}
}

func sshConfigCmd(g *globals) *cobra.Command {
	var (
		knownHosts string
		proxy      bool
		identity   string
	)
	cmd := &cobra.Command{
		Use:   "ssh-config [ID...]",
		Short: "Print ssh_config Host blocks for sandboxes (for ssh, scp, rsync, VS Code Remote-SSH, JetBrains Gateway)",
		Long: "ssh-config prints a Host block per sandbox (the IDs given, or every live sandbox) for\n" +
			"~/.ssh/config, and writes the endpoint's host key to --known-hosts, which the blocks name.\n" +
			"Logins use a key registered with ssh-keys add (--identity names its private key).\n" +
			"--proxy adds ProxyCommand sandboxctl ssh-proxy, which relays through the daemon's API\n" +
			"(its socket or --url) when the SSH endpoint itself is not reachable from here.",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ep, err := c.SSHEndpoint(cmd.Context())
			if err != nil {
				return err
			}
			if ep.Listen == "" && !proxy {
				return errdefs.Unavailablef("ssh: the daemon's SSH endpoint is off (ssh.listen)")
			}
			ids := args
			if len(ids) == 0 {
				sbs, err := c.ListSandboxes(cmd.Context(), "")
				if err != nil {
					return err
				}
				for _, sb := range sbs {
					ids = append(ids, sb.ID)
				}
			}
			if knownHosts == "" {
				home, err := os.UserHomeDir()
				if err != nil {
					return err
				}
				knownHosts = filepath.Join(home, ".ssh", "mcp-sandboxd_known_hosts")
			}
			if err := writeKnownHosts(knownHosts, ep.HostKey); err != nil {
				return err
			}
			host, port := "", ""
			if ep.Listen != "" {
				if host, port, err = sshHost(ep.Listen, g.url); err != nil {
					return err
				}
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			for _, id := range ids {
				fmt.Fprintf(g.stdout, "Host %s\n", id)
				if proxy {
					// --sandbox: through a gateway, the connection is routed
					// to the node that holds the sandbox.
					fmt.Fprintf(g.stdout, "  ProxyCommand %s%s ssh-proxy --sandbox %s\n", self, g.apiFlags(), id)
				} else {
					fmt.Fprintf(g.stdout, "  HostName %s\n  Port %s\n", host, port)
				}
				fmt.Fprintf(g.stdout, "  User %s\n  HostKeyAlias %s\n  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n",
					id, knownHostsAlias, knownHosts)
				if identity != "" {
					fmt.Fprintf(g.stdout, "  IdentityFile %s\n  IdentitiesOnly yes\n", identity)
				}
				fmt.Fprintf(g.stdout, "  ForwardAgent no\n  ForwardX11 no\n  ServerAliveInterval 30\n\n")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&knownHosts, "known-hosts", "", "file to write the endpoint's host key to (default ~/.ssh/mcp-sandboxd_known_hosts)")
	cmd.Flags().BoolVar(&proxy, "proxy", false, "reach the endpoint through sandboxctl ssh-proxy (the daemon's API) instead of directly")
	cmd.Flags().StringVar(&identity, "identity", "", "private key file to log in with (IdentityFile)")
	return cmd
}

// apiFlags repeats the flags that name the daemon, for a command line
// ssh runs later (ProxyCommand).
func (g *globals) apiFlags() string {
	if g.url != "" {
		return " --url " + shellQuote(g.url)
	}
	return " --socket " + shellQuote(g.socket)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func sshProxyCmd(g *globals) *cobra.Command {
	var sandboxID string
	cmd := &cobra.Command{
		Use:   "ssh-proxy",
		Short: "Relay stdin and stdout to the daemon's SSH endpoint through its API (ssh's ProxyCommand)",
		Long: "ssh-proxy is what ssh-config --proxy puts in ProxyCommand: it carries one SSH connection\n" +
			"over the daemon's API (the socket or --url, a WebSocket) to its SSH endpoint, for machines\n" +
			"that reach the API but not ssh.listen. The login itself still needs a key or a token.\n" +
			"With --sandbox it goes through that sandbox's path, which a gateway routes to its node.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			dial := c.DialSSH
			if sandboxID != "" {
				dial = func(ctx context.Context) (net.Conn, error) { return c.DialSSHFor(ctx, sandboxID) }
			}
			conn, err := dial(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			go func() {
				_, _ = io.Copy(conn, os.Stdin)
				// ssh closed our stdin: the connection is over.
				_ = conn.Close()
			}()
			_, err = io.Copy(g.stdout, conn)
			if errors.Is(err, net.ErrClosed) {
				err = nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&sandboxID, "sandbox", "", "the sandbox the connection logs in to: through its path (a gateway's route to its node)")
	return cmd
}
