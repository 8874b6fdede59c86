package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Lifecycle webhooks: webhooks create|list|get|update|enable|disable|
// delete|deliveries|redeliver (docs/webhooks.md).

func webhooksCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Short: "Lifecycle webhooks: signed POSTs of sandbox, run, autofix, quota and node events"}
	cmd.AddCommand(webhooksCreateCmd(g), webhooksListCmd(g), webhooksGetCmd(g), webhooksUpdateCmd(g),
		webhooksEnableCmd(g, true), webhooksEnableCmd(g, false), webhooksDeleteCmd(g),
		webhooksDeliveriesCmd(g), webhooksRedeliverCmd(g))
	return cmd
}

// splitEvents parses --events a,b (empty: every type).
func splitEvents(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func webhooksCreateCmd(g *globals) *cobra.Command {
	var (
		name, events string
		timeout      time.Duration
		disabled     bool
	)
	cmd := &cobra.Command{
		Use:   "create URL [--name N] [--events TYPE,...] [--timeout 10s] [--disabled]",
		Short: "Register a webhook and print its signing secret (shown once)",
		Long: "Register a webhook. Event types: " + strings.Join(apitypes.WebhookEventTypes, ", ") +
			" (default: all). The signing secret (whsec_...) is printed once; verify deliveries with any Standard Webhooks library.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout%time.Millisecond != 0 {
				return usagef("--timeout: want whole milliseconds, got %s", timeout)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			enabled := !disabled
			w, err := c.CreateWebhook(cmd.Context(), apitypes.WebhookCreateRequest{Name: name, URL: args[0],
				Events: splitEvents(events), TimeoutMS: int(timeout.Milliseconds()), Enabled: &enabled})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(w)
			}
			fmt.Fprintf(g.stderr, "webhook %s (%s) for %s; the secret is not shown again:\n", w.ID, w.State, w.URL)
			fmt.Fprintln(g.stdout, w.Secret)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a label")
	cmd.Flags().StringVar(&events, "events", "", "event types, comma-separated (default: all)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "bound on one delivery attempt, 1s to 30s (default 10s)")
	cmd.Flags().BoolVar(&disabled, "disabled", false, "register it disabled")
	return cmd
}

func printWebhooks(g *globals, ws []apitypes.Webhook) error {
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WEBHOOK\tNAME\tURL\tEVENTS\tSTATE\tFAILURES\tREASON")
	for _, w := range ws {
		events := strings.Join(w.Events, ",")
		if events == "" {
			events = "all"
		}
		reason := w.DisabledReason
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", w.ID, w.Name, w.URL, events, w.State, w.Failures, reason)
	}
	return tw.Flush()
}

func webhooksListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List webhooks with their state and failures", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.Webhooks(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(l)
			}
			return printWebhooks(g, l)
		},
	}
}

func webhooksGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get WEBHOOK", Short: "Show one webhook", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			w, err := c.Webhook(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(w)
			}
			return printWebhooks(g, []apitypes.Webhook{*w})
		},
	}
}

func webhooksUpdateCmd(g *globals) *cobra.Command {
	var (
		name, url, events string
		timeout           time.Duration
	)
	cmd := &cobra.Command{
		Use: "update WEBHOOK [--name N] [--url URL] [--events TYPE,...] [--timeout D]", Short: "Change a webhook's fields",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := apitypes.WebhookUpdateRequest{ID: args[0]}
			f := cmd.Flags()
			if f.Changed("name") {
				req.Name = &name
			}
			if f.Changed("url") {
				req.URL = &url
			}
			if f.Changed("events") {
				ev := splitEvents(events)
				if ev == nil {
					ev = []string{}
				}
				req.Events = &ev
			}
			if f.Changed("timeout") {
				ms := int(timeout.Milliseconds())
				req.TimeoutMS = &ms
			}
			return updateWebhook(cmd, g, req)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a label")
	cmd.Flags().StringVar(&url, "url", "", "the http(s) URL")
	cmd.Flags().StringVar(&events, "events", "", "event types, comma-separated (empty: all)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "bound on one delivery attempt, 1s to 30s")
	return cmd
}

func updateWebhook(cmd *cobra.Command, g *globals, req apitypes.WebhookUpdateRequest) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	w, err := c.UpdateWebhook(cmd.Context(), req)
	if err != nil {
		return err
	}
	if g.json {
		return g.printJSON(w)
	}
	return printWebhooks(g, []apitypes.Webhook{*w})
}

func webhooksEnableCmd(g *globals, enable bool) *cobra.Command {
	use, short := "enable WEBHOOK", "Enable a webhook (clears its failures; its pending deliveries resume)"
	if !enable {
		use, short = "disable WEBHOOK", "Disable a webhook (its deliveries wait until it is enabled)"
	}
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return updateWebhook(cmd, g, apitypes.WebhookUpdateRequest{ID: args[0], Enabled: &enable})
		},
	}
}

func webhooksDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "delete WEBHOOK", Aliases: []string{"rm"}, Short: "Delete a webhook and its delivery log", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteWebhook(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(g.stderr, "deleted", args[0])
			return nil
		},
	}
}

func webhooksDeliveriesCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use: "deliveries WEBHOOK [--limit N]", Short: "List a webhook's deliveries, newest first", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ds, err := c.WebhookDeliveries(cmd.Context(), args[0], limit)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(ds)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DELIVERY\tEVENT\tSTATE\tATTEMPTS\tLAST\tCREATED\tNEXT")
			for _, d := range ds {
				last := "-"
				switch {
				case d.LastError != "":
					last = d.LastError
				case d.LastStatus != 0:
					last = fmt.Sprintf("HTTP %d", d.LastStatus)
				}
				next := "-"
				if !d.NextAttemptAt.IsZero() {
					next = d.NextAttemptAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.EventType, d.State, d.Attempts, last, ago(now, d.CreatedAt), next)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "most deliveries to list (default 50, at most 500)")
	return cmd
}

func webhooksRedeliverCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "redeliver WEBHOOK DELIVERY", Short: "Queue a delivery again, with the same webhook-id", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.RedeliverWebhook(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(d)
			}
			fmt.Fprintln(g.stderr, "queued", d.ID, "again")
			return nil
		},
	}
}
