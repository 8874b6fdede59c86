package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

type sandboxCreateIn = apitypes.CreateSandboxRequest

// sandboxOut is a sandbox as the tools show it: sandbox_get's detail, of
// which sandbox_create fills the sandbox only.
type sandboxOut = apitypes.SandboxDetail

type sandboxListIn struct {
	State string `json:"state,omitempty" jsonschema_description:"Only sandboxes in this state; default: the live ones (creating, ready, running); all: every state." jsonschema:"enum=creating,enum=ready,enum=running,enum=terminated,enum=failed,enum=all"`
}

type sandboxListOut = apitypes.SandboxList

type sandboxIDIn struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of the sandbox, as sandbox_create returned it (sb-...)."`
}

type sandboxTerminateOut = apitypes.SandboxState

type languagesIn struct{}

type languagesOut = apitypes.LanguageList

func (s *srv) addSandboxTools() {
	addTool[sandboxCreateIn, sandboxOut](s, "sandbox_create", "Create a sandbox",
		joinLines(
			"Create an isolated Linux sandbox for one language and return its sandbox_id (state ready), for use with exec_command, file_*, run_code {sandbox_id}, run_task and packages_install.",
			"Prerequisite: a language from languages_list. Files live under /workspace; commands run as an unprivileged user.",
			fmt.Sprintf("Limits: defaults memory %s, %v CPUs, %d pids, disk %s; at most %d sandboxes at once. Network is none unless asked for. An idle sandbox is terminated after %s, any sandbox after %s.",
				s.cfg.Sandbox.Memory, s.cfg.Sandbox.CPUs, s.cfg.Sandbox.Pids, s.cfg.Sandbox.Disk, s.cfg.Sandbox.MaxSandboxes, s.cfg.Sandbox.IdleTimeout, s.cfg.Sandbox.MaxLifetime),
			"For a single program, run_code without sandbox_id is simpler: it creates and removes its own sandbox.",
			fmt.Sprintf("backend vm starts a QEMU virtual machine instead (own kernel, no network; seconds from a saved snapshot, tens of seconds the first time; at most %d at once): image linux (a minimal Debian guest with python3) or a language (python has pytest). The sandbox tools work on it as far as its capabilities (in the result) go; os windows, or linux when the server has vm.images.linux, boots an administrator's disk reached through the QEMU guest agent: exec_command, file_read/file_write (as root/SYSTEM, absolute paths), sandbox_snapshot/restore (the whole machine) and sandbox_screenshot.", s.cfg.VM.MaxVMs),
		),
		annotations{},
		func(ctx context.Context, c *call, in *sandboxCreateIn) (*result, error) {
			req := *in
			req.Labels = c.withSessionLabel(in.Labels)
			var progress func(string)
			if out := c.progress.outputFunc(); out != nil {
				// A VM's first use builds its guest image (minutes), a
				// disk guest boots: their phase and log lines, one
				// notification each.
				progress = func(line string) { out("stdout", []byte(line+"\n")) }
			}
			info, err := s.e.CreateSandboxProgress(ctx, req, progress)
			if err != nil {
				return nil, err
			}
			return &result{structured: sandboxOut{Sandbox: *info}, text: sandboxText(info, nil)}, nil
		})

	addTool[sandboxListIn, sandboxListOut](s, "sandbox_list", "List sandboxes",
		"List sandboxes: by default the live ones (creating, ready, running), every one the server holds (created over MCP, REST or sandboxctl). state filters; \"all\" includes terminated and failed ones.",
		annotations{readOnly: true, idempotent: true},
		s.sandboxList)

	addTool[sandboxIDIn, sandboxOut](s, "sandbox_get", "Describe a sandbox",
		"Describe one sandbox: state, language, limits, network, labels, timestamps, and for a live sandbox its current usage (memory_bytes, cpu_seconds, pids, disk_bytes).",
		annotations{readOnly: true, idempotent: true},
		s.sandboxGet)

	addTool[apitypes.SandboxNetworkRequest, apitypes.NetworkStatus](s, "sandbox_network", "Show or change a sandbox's network",
		"Change a running sandbox's network policy without recreating it: mode egress (every public destination) or allowlist (only the names, *.domain wildcards, IPv4 CIDRs and @presets in allow; other names do not resolve). With neither mode nor allow, report the policy. The answer has the counters of allowed and denied connection attempts and the recent denied destinations. A sandbox created with network none keeps it.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.SandboxNetworkRequest) (*result, error) {
			st, err := s.e.SandboxNetwork(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: st, text: networkText(st)}, nil
		})

	addTool[sandboxIDIn, sandboxTerminateOut](s, "sandbox_terminate", "Terminate a sandbox",
		"Stop a sandbox for good (terminate, destroy): kill every process in it and delete its files. It cannot be used afterwards. Terminating a terminated sandbox is a no-op.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *sandboxIDIn) (*result, error) {
			info, err := s.e.TerminateSandbox(ctx, in.SandboxID)
			if err != nil {
				return nil, err
			}
			out := sandboxTerminateOut{SandboxID: info.ID, State: string(info.State)}
			return &result{structured: out, text: fmt.Sprintf("sandbox %s is %s", out.SandboxID, out.State)}, nil
		})
}

func networkText(n *apitypes.NetworkStatus) string {
	return fmt.Sprintf("network %s, allow [%s]: %d connection attempts allowed, %d denied; recent denied: %s\n",
		n.Mode, strings.Join(n.Allow, " "), n.Counters.Allowed, n.Counters.Denied, strings.Join(n.Counters.DeniedDestinations, " "))
}

func (s *srv) addPauseTools() {
	addTool[sandboxIDIn, sandboxTerminateOut](s, "sandbox_pause", "Pause a sandbox",
		"Freeze every process of a sandbox: it keeps its memory, files and running commands but uses no CPU, and the idle timeout does not run while it is paused. Commands and file operations are refused (conflict) until sandbox_resume. Pausing a paused sandbox is a no-op. A VM's vCPUs stop; a sandbox without the pause capability (a VM of an administrator's disk) answers unavailable.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *sandboxIDIn) (*result, error) {
			info, err := s.e.PauseSandbox(ctx, in.SandboxID)
			if err != nil {
				return nil, err
			}
			out := sandboxTerminateOut{SandboxID: info.ID, State: string(info.State)}
			return &result{structured: out, text: fmt.Sprintf("sandbox %s is %s", out.SandboxID, out.State)}, nil
		})
	addTool[sandboxIDIn, sandboxTerminateOut](s, "sandbox_resume", "Resume a sandbox",
		"Thaw a paused sandbox: its processes continue where they stopped (state running if commands are in flight, else ready). Resuming a sandbox that is not paused is a no-op.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *sandboxIDIn) (*result, error) {
			info, err := s.e.ResumeSandbox(ctx, in.SandboxID)
			if err != nil {
				return nil, err
			}
			out := sandboxTerminateOut{SandboxID: info.ID, State: string(info.State)}
			return &result{structured: out, text: fmt.Sprintf("sandbox %s is %s", out.SandboxID, out.State)}, nil
		})
}

func (s *srv) addLanguagesTool() {
	addTool[languagesIn, languagesOut](s, "languages_list", "List languages",
		"List the languages sandboxes and run_code support: name, version, image (and whether it is built: image_ready; an unbuilt image is built on first use, which takes minutes), file extensions, entrypoint, tasks for run_task (lint/build/test) and package managers for packages_install. Call it first.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *languagesIn) (*result, error) {
			langs, err := s.e.Languages(ctx)
			if err != nil {
				return nil, err
			}
			if langs == nil {
				langs = []apitypes.LanguageInfo{}
			}
			var text strings.Builder
			for _, l := range langs {
				ready := "image ready"
				if !l.ImageReady {
					ready = "image not built"
				}
				fmt.Fprintf(&text, "%s %s (%s): extensions %s, entrypoint %s, tasks [%s], managers [%s]\n", l.Name, l.Version, ready,
					strings.Join(l.Extensions, " "), l.Entrypoint, strings.Join(l.Tasks, " "), strings.Join(l.Managers, " "))
			}
			return &result{structured: languagesOut{Languages: langs}, text: text.String()}, nil
		})
}

func sandboxText(sb *apitypes.Sandbox, u *apitypes.Usage) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: %s, language %s, image %s, network %s\n", sb.ID, sb.State, sb.Language, sb.Image, sb.Network)
	fmt.Fprintf(&b, "limits: memory %d MiB, %v CPUs, %d pids, disk %d MiB\n", sb.Limits.MemoryBytes>>20, sb.Limits.CPUs, sb.Limits.Pids, sb.Limits.DiskBytes>>20)
	if u != nil {
		fmt.Fprintf(&b, "usage: memory %d bytes, cpu %.2f s, %d pids, disk %d bytes\n", u.MemoryBytes, u.CPUSeconds, u.Pids, u.DiskBytes)
	}
	if v := sb.VM; v != nil {
		fmt.Fprintf(&b, "vm: os %s", v.OS)
		if v.Accel != "" {
			fmt.Fprintf(&b, ", accel %s, guest agent %s", v.Accel, v.GuestAgent)
		}
		if len(v.Snapshots) > 0 {
			fmt.Fprintf(&b, ", snapshots %s", strings.Join(v.Snapshots, " "))
		}
		b.WriteString("\n")
	}
	if len(sb.Capabilities) > 0 {
		fmt.Fprintf(&b, "capabilities: %s\n", strings.Join(sb.Capabilities, ", "))
	}
	if sb.Reason != "" {
		fmt.Fprintf(&b, "reason: %s\n", sb.Reason)
	}
	return b.String()
}

// sandboxList is sandbox_list: the sandboxes in a state, as many as the
// result holds, with the total.
func (s *srv) sandboxList(ctx context.Context, c *call, in *sandboxListIn) (*result, error) {
	list, err := s.e.ListSandboxes(ctx, in.State)
	if err != nil {
		return nil, err
	}
	return s.fit(func(limit int) *result {
		out := sandboxListOut{Sandboxes: []apitypes.Sandbox{}, Total: len(list)}
		size := 0
		var text strings.Builder
		fmt.Fprintf(&text, "%d sandboxes\n", len(list))
		for _, sb := range list {
			line := fmt.Sprintf("%s  %-10s %-8s created %s\n", sb.ID, sb.State, sb.Language, sb.CreatedAt.Format("2006-01-02 15:04:05"))
			size += 600 + len(line)
			if size > limit {
				out.Truncated = true
				break
			}
			out.Sandboxes = append(out.Sandboxes, *sb)
			text.WriteString(line)
		}
		if out.Truncated {
			fmt.Fprintf(&text, "[list cut at %d of %d to fit the result; filter with state]\n", len(out.Sandboxes), len(list))
		}
		return &result{structured: out, text: text.String()}
	}), nil
}

// sandboxGet is sandbox_get: the sandbox with its usage, network and
// credential counters.
func (s *srv) sandboxGet(ctx context.Context, c *call, in *sandboxIDIn) (*result, error) {
	d, err := s.e.GetSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	text := sandboxText(&d.Sandbox, d.Usage)
	if n := d.NetworkStatus; n != nil {
		text += networkText(n)
	}
	for name, u := range d.CredentialUsage {
		text += fmt.Sprintf("credential %s: %d requests, %d input + %d output tokens, %d refused %s\n", name, u.Requests, u.InputTokens, u.OutputTokens, u.Refused, u.CapReached)
	}
	return &result{structured: *d, text: text}, nil
}
