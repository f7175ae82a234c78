package filetable

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// RemoveOrphans deletes the files of the table that no snapshot
// references and that were last modified more than olderThan ago, and
// returns their paths, sorted. The files it considers are data files
// (data/*.ndjson), manifests (manifest/manifest-*.json) and the temporary
// files of interrupted writes (.*.tmp in data/, manifest/ and snapshot/);
// it never deletes a snapshot, a file any snapshot references, or a
// file it does not know. It reads every snapshot and every manifest they
// reference first, and deletes nothing if any of them cannot be read.
//
// Orphans are what failures leave: the files of a writer that failed or
// was closed after its last Prepare, data files prepared for a checkpoint
// that never completed, the manifests of a commit that failed or lost its
// snapshot id, manifests no newer snapshot lists after a merge (when no
// snapshot lists them at all), and temporary files.
//
// olderThan is what keeps files that are not orphans yet. A writer's open
// file is referenced by nothing until a commit publishes it. A file it
// prepared is referenced by nothing while its committable sits in the
// committer's state and in checkpoints, until the checkpoint completes and
// the commit runs: after a failure that is when a restarted job restores
// it, and after a process crash whenever the job is started again, which
// may be days later. A commit in progress has written its manifest, not
// its snapshot yet. So olderThan must exceed the longest time a data file
// can wait between its creation and its commit: the checkpoint interval
// plus the longest outage after which the job is still restored from its
// checkpoints. Paimon's remove_orphan_files has the same older_than, one
// day by default; so should callers here, unless the job writing the
// table is known to be stopped for good or its checkpoints discarded. A
// file whose filesystem reports no modification time is kept.
func (t *Table) RemoveOrphans(olderThan time.Duration) ([]string, error) {
	fs := t.o.fs
	cutoff := t.o.now().Add(-olderThan)
	// The candidates first, then the references: a file created after
	// the listing is no candidate, and a snapshot linked after the
	// references were read can reference a candidate only if that file
	// waited longer than olderThan for its commit (see above).
	type candidate struct {
		dir, name string
	}
	var cands []candidate
	for _, dir := range []string{DataDir, ManifestDir, SnapshotDir} {
		names, err := fs.List(t.path(dir))
		if err != nil {
			return nil, fmt.Errorf("filetable: remove orphans: list %s: %w", t.path(dir), err)
		}
		for _, name := range names {
			switch {
			case strings.HasPrefix(name, ".") && strings.HasSuffix(name, tempExt):
			case dir == DataDir && validDataPath(DataDir+"/"+name):
			case dir == ManifestDir && validManifestName(name):
			default:
				continue
			}
			fi, err := fs.Stat(t.path(dir, name))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				return nil, fmt.Errorf("filetable: remove orphans: %w", err)
			}
			if fi.IsDir() || fi.ModTime().IsZero() || !fi.ModTime().Before(cutoff) {
				continue
			}
			cands = append(cands, candidate{dir, name})
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	snaps, err := t.Snapshots()
	if err != nil {
		return nil, fmt.Errorf("filetable: remove orphans (nothing removed): %w", err)
	}
	manifests, data := map[string]bool{}, map[string]bool{}
	for _, s := range snaps {
		refs := s.Manifests
		if s.Delta != nil {
			refs = append(slices.Clone(refs), *s.Delta)
		}
		for _, ref := range refs {
			if manifests[ref.Name] {
				continue
			}
			m, err := t.readManifest(ref)
			if err != nil {
				return nil, fmt.Errorf("filetable: remove orphans (nothing removed): snapshot %d: %w", s.ID, err)
			}
			manifests[ref.Name] = true
			for _, f := range m.Files {
				data[f.Path[len(DataDir)+1:]] = true
			}
		}
	}
	var removed []string
	synced := map[string]bool{}
	for _, c := range cands {
		if c.dir == DataDir && data[c.name] || c.dir == ManifestDir && manifests[c.name] {
			continue
		}
		p := t.path(c.dir, c.name)
		if err := fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			slices.Sort(removed)
			return removed, fmt.Errorf("filetable: remove orphan %s: %w", p, err)
		}
		removed = append(removed, p)
		synced[c.dir] = false
	}
	for dir := range synced {
		if err := t.syncDir(t.path(dir)); err != nil {
			slices.Sort(removed)
			return removed, fmt.Errorf("filetable: remove orphans: sync %s: %w", t.path(dir), err)
		}
	}
	slices.Sort(removed)
	return removed, nil
}
