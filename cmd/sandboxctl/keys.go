package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// API keys: keys create|list|revoke|rotate|usage (admin; usage of one's
// own key for any key).

func keysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "API keys: create, list, revoke, rotate, usage against quota"}
	cmd.AddCommand(keysCreateCmd(g), keysListCmd(g), keysRevokeCmd(g), keysRotateCmd(g), keysUsageCmd(g))
	return cmd
}

// parseQuota parses --quota sandboxes=N,memory=2G,cpus=4,disk=10G,creates=30.
func parseQuota(s string) (apitypes.Quota, error) {
	var q apitypes.Quota
	if s == "" {
		return q, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return q, usagef("--quota: %q is not NAME=VALUE", kv)
		}
		var err error
		switch k {
		case "sandboxes":
			q.Sandboxes, err = strconv.Atoi(v)
		case "memory":
			q.MemoryMB, err = parseMB("quota memory", v)
		case "cpus":
			q.CPUs, err = strconv.ParseFloat(v, 64)
		case "disk":
			q.DiskMB, err = parseMB("quota disk", v)
		case "creates":
			q.CreatesPerMinute, err = strconv.Atoi(v)
		default:
			return q, usagef("--quota: unknown quota %q (sandboxes, memory, cpus, disk, creates)", k)
		}
		if err != nil {
			return q, usagef("--quota: %s: %v", k, err)
		}
	}
	return q, nil
}

func keysCreateCmd(g *globals) *cobra.Command {
	var (
		tenant, quota string
		admin         bool
		expires       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create NAME [--tenant T] [--admin] [--quota sandboxes=N,memory=2G,cpus=4,disk=10G,creates=30] [--expires 720h]",
		Short: "Create an API key and print its secret (shown once: the daemon keeps only its hash)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := parseQuota(quota)
			if err != nil {
				return err
			}
			if expires < 0 || expires%time.Second != 0 {
				return usagef("--expires: want a positive whole number of seconds (e.g. 720h), got %s", expires)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), apitypes.KeyCreateRequest{Name: args[0], Tenant: tenant, Admin: admin, Quota: q, ExpiresIn: int64(expires / time.Second)})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(k)
			}
			fmt.Fprintf(g.stderr, "key %s (tenant %s, scope %s); the secret is not shown again:\n", k.ID, k.Tenant, k.Scope)
			fmt.Fprintln(g.stdout, k.Secret)
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant that owns what the key creates (default: the key's name)")
	cmd.Flags().BoolVar(&admin, "admin", false, "scope admin: every tenant's sandboxes, and the keys")
	cmd.Flags().StringVar(&quota, "quota", "", "quotas, comma-separated: sandboxes=N, memory=SIZE, cpus=N, disk=SIZE, creates=N (per minute)")
	cmd.Flags().DurationVar(&expires, "expires", 0, "lifetime of the key (e.g. 720h); 0: never expires")
	return cmd
}

func keysListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List API keys: name, tenant, scope, quota, created, last used, expiry, revocation",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Keys(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			now := time.Now()
			when := func(t *time.Time) string {
				if t == nil {
					return "-"
				}
				return ago(now, *t)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tNAME\tTENANT\tSCOPE\tQUOTA\tCREATED\tLAST USED\tEXPIRES\tREVOKED")
			for _, k := range l {
				exp := "never"
				if k.ExpiresAt != nil {
					exp = k.ExpiresAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Tenant, k.Scope, quotaText(k.Quota),
					ago(now, k.CreatedAt), when(k.LastUsedAt), exp, when(k.RevokedAt))
			}
			return tw.Flush()
		},
	}
}

func quotaText(q apitypes.Quota) string {
	var parts []string
	if q.Sandboxes > 0 {
		parts = append(parts, fmt.Sprintf("sandboxes=%d", q.Sandboxes))
	}
	if q.MemoryMB > 0 {
		parts = append(parts, fmt.Sprintf("memory=%dM", q.MemoryMB))
	}
	if q.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("cpus=%g", q.CPUs))
	}
	if q.DiskMB > 0 {
		parts = append(parts, fmt.Sprintf("disk=%dM", q.DiskMB))
	}
	if q.CreatesPerMinute > 0 {
		parts = append(parts, fmt.Sprintf("creates=%d", q.CreatesPerMinute))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

func keysRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke KEY_ID",
		Short: "Revoke an API key: its next request is refused (open MCP and web sessions included)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.RevokeKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(k)
			}
			fmt.Fprintln(g.stdout, k.ID)
			return nil
		},
	}
}

func keysRotateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate KEY_ID",
		Short: "Give an API key a new secret and print it; the old secret stops working at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.RotateKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(k)
			}
			fmt.Fprintln(g.stdout, k.Secret)
			return nil
		},
	}
}

func keysUsageCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "usage [KEY_ID]",
		Short: "Show a key's quota and what its live sandboxes use (default: the key sandboxctl authenticates with)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			u, err := c.KeyUsage(cmd.Context(), id)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(u)
			}
			q := u.Quota
			lim := func(v string, zero bool) string {
				if zero {
					return "unlimited"
				}
				return v
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "key\t%s (%s), tenant %s\n", u.KeyID, u.Name, u.Tenant)
			fmt.Fprintln(tw, "QUOTA\tUSE\tLIMIT")
			fmt.Fprintf(tw, "sandboxes\t%d\t%s\n", u.Use.Sandboxes, lim(strconv.Itoa(q.Sandboxes), q.Sandboxes == 0))
			fmt.Fprintf(tw, "memory\t%dM\t%s\n", u.Use.MemoryMB, lim(fmt.Sprintf("%dM", q.MemoryMB), q.MemoryMB == 0))
			fmt.Fprintf(tw, "cpus\t%g\t%s\n", u.Use.CPUs, lim(fmt.Sprintf("%g", q.CPUs), q.CPUs == 0))
			fmt.Fprintf(tw, "disk\t%dM\t%s\n", u.Use.DiskMB, lim(fmt.Sprintf("%dM", q.DiskMB), q.DiskMB == 0))
			fmt.Fprintf(tw, "creates/min\t%d\t%s\n", u.Use.CreatesLastMinute, lim(strconv.Itoa(q.CreatesPerMinute), q.CreatesPerMinute == 0))
			return tw.Flush()
		},
	}
}
