package oci

import (
	"os"
	"path/filepath"
	"strings"
)

// CollectLayers removes the layers of the layer store that no stored
// image (current or stale) lists, and the build-cache entries whose layer
// is gone, and returns the diff ids removed and the bytes freed. The
// caller keeps pulls, imports and builds from running meanwhile (they
// read layers they found stored, and record layers before the images
// naming them): images.Service runs it only when none is in flight.
//
// It needs no ledger of its own to be crash-safe: the images are the
// record of what is used, and each removal is one unlink of a layer no
// image names, so a crash at any point leaves a store where every image's
// layers are present; the next collection finishes the job.
func (im *Importer) CollectLayers() (removed []string, freed int64, err error) {
	used := map[string]bool{}
	current, err := im.o.Store.List()
	if err != nil {
		return nil, 0, err
	}
	stale, err := im.o.Store.Stale()
	if err != nil {
		return nil, 0, err
	}
	for _, img := range append(current, stale...) {
		if img.OCI == nil {
			continue
		}
		for _, l := range img.OCI.Layers {
			used[strings.TrimPrefix(l, "sha256:")] = true
		}
	}
	entries, err := os.ReadDir(im.layers)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range entries {
		n := e.Name()
		if !isHex64(n) || used[n] {
			continue // spool files are removeAbandoned's
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if err := os.Remove(filepath.Join(im.layers, n)); err != nil && !os.IsNotExist(err) {
			return removed, freed, err
		}
		removed = append(removed, "sha256:"+n)
		freed += fi.Size()
	}
	// Cache entries of removed layers would only miss; drop them.
	cache, _ := os.ReadDir(im.cacheDir())
	for _, e := range cache {
		if isHex64(e.Name()) && im.cached(e.Name()) == "" {
			_ = os.Remove(filepath.Join(im.cacheDir(), e.Name()))
		}
	}
	return removed, freed, nil
}

// RemoveDebris removes what crashed or interrupted pulls, imports and
// builds left, whatever its age: spool files, records half-written,
// intermediate images (removeSpools). The caller keeps pulls, imports and
// builds from running meanwhile, as for CollectLayers; without that
// guarantee New removes only what is older than any of them runs.
func (im *Importer) RemoveDebris() ([]string, error) { return im.removeSpools(0) }
