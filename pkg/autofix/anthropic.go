package autofix

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Defaults of the anthropic provider.
const (
	DefaultAnthropicModel     = anthropic.ModelClaudeSonnet5
	DefaultAnthropicMaxTokens = 8192
	defaultAnthropicRetries   = 4
)

// systemPrompt tells the model what shape of answer the loop can apply.
const systemPrompt = "You fix programs that fail. Answer only with code: the complete new content of each file " +
	"you change in a fenced code block whose info string is the language and the file's path, or a unified diff."

// AnthropicProvider asks the Anthropic Messages API for fixes through the
// official Go SDK, which retries 429 and 5xx answers with backoff and
// honours retry-after.
//
// Security boundary: the API key is read from KeyFile or the KeyEnv
// variable of the daemon at each call and goes only into the x-api-key
// header of requests to BaseURL. It is never logged, never part of an
// error, a run record or a fix request, and never enters a sandbox (the
// loop's sandboxes get their environment from the request, not from the
// daemon).
type AnthropicProvider struct {
	Model     string
	BaseURL   string // empty: the SDK's default
	MaxTokens int64
	KeyEnv    string
	KeyFile   string
	// MaxRetries is how often a 429 or 5xx answer is retried (0: the
	// default, 4; -1: never).
	MaxRetries int
}

// Name is "anthropic".
func (p *AnthropicProvider) Name() string { return "anthropic" }

// errNoKey says where the key was looked for, not what it is.
var errNoKey = errors.New("no API key")

// key reads the API key.
func (p *AnthropicProvider) key() (string, error) {
	if p.KeyFile != "" {
		b, err := os.ReadFile(p.KeyFile)
		if err != nil {
			return "", fmt.Errorf("%w: read autofix.api_key_file: %v", errNoKey, errors.Unwrap(err))
		}
		if k := strings.TrimSpace(string(b)); k != "" {
			return k, nil
		}
		return "", fmt.Errorf("%w: autofix.api_key_file %s is empty", errNoKey, p.KeyFile)
	}
	if p.KeyEnv != "" {
		if k := strings.TrimSpace(os.Getenv(p.KeyEnv)); k != "" {
			return k, nil
		}
		return "", fmt.Errorf("%w: the environment variable %s (autofix.api_key_env) is not set", errNoKey, p.KeyEnv)
	}
	return "", fmt.Errorf("%w: set autofix.api_key_env or autofix.api_key_file", errNoKey)
}

// Configured reports whether the provider can be used: it has a key.
func (p *AnthropicProvider) Configured() error {
	_, err := p.key()
	return err
}

// Fix sends the prompt as one user message and returns the text of the
// answer with its token usage.
func (p *AnthropicProvider) Fix(ctx context.Context, req *FixRequest) (*Answer, error) {
	key, err := p.key()
	if err != nil {
		return nil, err
	}
	retries := p.MaxRetries
	switch {
	case retries == 0:
		retries = defaultAnthropicRetries
	case retries < 0:
		retries = 0
	}
	opts := []option.RequestOption{option.WithAPIKey(key), option.WithMaxRetries(retries)}
	if p.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(p.BaseURL))
	}
	model, maxTokens := p.Model, p.MaxTokens
	if model == "" {
		model = DefaultAnthropicModel
	}
	if maxTokens <= 0 {
		maxTokens = DefaultAnthropicMaxTokens
	}
	client := anthropic.NewClient(opts...)
	msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
		Model:     model,
		MaxTokens: maxTokens,
		System:    []anthropic.TextBlockParam{{Text: systemPrompt}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(req.Prompt()))},
	})
	if err != nil {
		return nil, apiError(err, key)
	}
	var text strings.Builder
	for _, block := range msg.Content {
		if block.Type == "text" {
			text.WriteString(block.Text)
		}
	}
	return &Answer{Text: text.String(), Usage: &apitypes.TokenUsage{
		InputTokens: msg.Usage.InputTokens, OutputTokens: msg.Usage.OutputTokens,
	}}, nil
}

// apiError turns an SDK error into one that says what went wrong without
// the request dump the SDK's message carries (headers included), and
// without the key should the server echo it.
func apiError(err error, key string) error {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		msg := fmt.Sprintf("the Messages API answered %d", apiErr.StatusCode)
		if t := strings.TrimSpace(string(apiErr.Type())); t != "" {
			msg += " (" + t + ")"
		}
		return errors.New(strings.ReplaceAll(msg, key, "[key]"))
	}
	return errors.New(strings.ReplaceAll(err.Error(), key, "[key]"))
}
