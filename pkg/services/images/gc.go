package images

import (
	"context"
	"errors"
	"sync"
)

// layerUse counts the pulls, imports and builds in flight: they read
// layers they found in the layer store and add layers before an image
// names them, so the layer gc (CollectLayers) waits for a moment when
// none runs, and none starts while it runs.
type layerUse struct {
	mu     sync.Mutex
	active int
}

// useLayers marks an operation that reads or adds layers as in flight
// until the returned function is called. Nested operations (a build
// pulling its base) count twice, which is harmless.
func (s *Service) useLayers() func() {
	s.layerUse.mu.Lock()
	s.layerUse.active++
	s.layerUse.mu.Unlock()
	return func() {
		s.layerUse.mu.Lock()
		s.layerUse.active--
		s.layerUse.mu.Unlock()
	}
}

// CollectLayers removes the layers no stored image uses (pkg/oci
// Importer.CollectLayers), unless a pull, import or build is in flight:
// then it removes nothing (busy reports it) and the next prune collects.
func (s *Service) CollectLayers() (removed []string, freed int64, err error) {
	s.layerUse.mu.Lock()
	defer s.layerUse.mu.Unlock()
	if s.layerUse.active > 0 {
		return nil, 0, nil
	}
	im, err := s.importer(context.Background())
	if err != nil {
		return nil, 0, err
	}
	return im.CollectLayers()
}

// RemoveDebris removes what crashed or interrupted pulls, imports, builds
// and removals left in the image store: lock files no process holds,
// half-built and half-removed trees (image.Store.RemoveDebris), and, when
// no pull, import or build of this daemon is in flight, every spool file,
// half-written record and build intermediate (oci Importer.RemoveDebris);
// while one is, those wait for the next prune. It returns what it removed,
// relative to the image store.
func (s *Service) RemoveDebris() ([]string, error) {
	removed, err := s.images.RemoveDebris()
	s.layerUse.mu.Lock()
	defer s.layerUse.mu.Unlock()
	if s.layerUse.active > 0 {
		return removed, err
	}
	im, ierr := s.importer(context.Background())
	if ierr != nil {
		return removed, errors.Join(err, ierr)
	}
	spools, serr := im.RemoveDebris()
	return append(removed, spools...), errors.Join(err, serr)
}
