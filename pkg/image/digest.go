package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// builderVersion is part of every digest. Bump it whenever the build steps
// change what ends up in an image, so that existing images are rebuilt.
const builderVersion = "1"

// digestInput is the canonical form hashed into an image digest. JSON is
// canonical enough here: struct fields keep their order and map keys are
// sorted by encoding/json.
type digestInput struct {
	BuilderVersion string   `json:"builder_version"`
	Suite          string   `json:"suite"`
	Mirror         string   `json:"mirror"`
	Recipe         *Recipe  `json:"recipe"`
	FileSHA256     []string `json:"file_sha256"`
}

// recipeDigest returns the hex SHA-256 identifying the image that building r
// from suite and mirror produces: the recipe as parsed (so formatting and
// comments do not count, defaults do), the content of every file it copies,
// the suite, the mirror and the builder version.
func recipeDigest(r *Recipe, suite, mirror string) (string, error) {
	in := digestInput{BuilderVersion: builderVersion, Suite: suite, Mirror: mirror, Recipe: r}
	for i, f := range r.Files {
		src, err := r.sourcePath(f)
		if err != nil {
			return "", fmt.Errorf("files[%d].src: %w", i, err)
		}
		sum, err := fileSHA256(src)
		if err != nil {
			return "", fmt.Errorf("files[%d].src: %w", i, err)
		}
		in.FileSHA256 = append(in.FileSHA256, sum)
	}
	b, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("encode recipe: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func fileSHA256(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
