package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-llm/kiln/hub"
	"github.com/kiln-llm/kiln/ollama"
)

// List returns the models of the hub cache and of Ollama's store: every
// checkpoint snapshot and every GGUF file of a hub repository, and every
// GGUF model of Ollama's, hub models first, each group in name order. What
// cannot be read is reported in errs and left out.
func (c *Catalog) List() (models []*Model, errs []error) {
	repos, err := c.Hub.Cache.Repos()
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range repos {
		for _, s := range r.Snapshots {
			models = append(models, snapshotModels(r, s)...)
		}
	}
	sort.SliceStable(models, func(i, j int) bool { return models[i].Name < models[j].Name })
	oms, oerrs := c.Ollama.List()
	errs = append(errs, oerrs...)
	for _, om := range oms {
		models = append(models, ollamaModel(om))
	}
	return models, errs
}

// snapshotModels are the models of one snapshot: the checkpoint, or each
// GGUF file, named so that Resolve finds them again.
func snapshotModels(r hub.Repo, s hub.Snapshot) []*Model {
	ref := hub.Ref{Repo: r.ID}
	if !slices.Contains(s.Refs, hub.DefaultRevision) {
		ref.Revision = s.Commit[:12]
		if len(s.Refs) > 0 {
			ref.Revision = s.Refs[0] // a tag or branch reads better than a commit
		}
	}
	var out []*Model
	hasConfig, hasWeights := false, false
	for _, f := range s.Files {
		switch {
		case f.Name == "config.json":
			hasConfig = true
		case !strings.Contains(f.Name, "/") && strings.HasSuffix(f.Name, ".safetensors"):
			hasWeights = true
		case strings.HasSuffix(strings.ToLower(f.Name), ".gguf") && !strings.Contains(strings.ToLower(f.Name), "mmproj"):
			gref := ref
			gref.Quant = hub.QuantOf(f.Name)
			if m, err := hubModel(gref, s.Commit, f.Path, r.Dir); err == nil {
				out = append(out, m)
			}
		}
	}
	if hasConfig && hasWeights {
		if m, err := hubModel(ref, s.Commit, s.Dir, r.Dir); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// Pull downloads a hub model into the cache (see hub.Client.Pull) and
// returns it. Ollama names are refused with what to run instead: kiln
// reads Ollama's store but does not write it.
func (c *Catalog) Pull(ctx context.Context, name string, progress func(hub.Event)) (*Model, *hub.Pulled, error) {
	ref, err := hub.ParseRef(strings.TrimPrefix(name, "hf:"))
	if err != nil {
		if n, oerr := parseOllamaOnly(name); oerr == nil {
			return nil, nil, fmt.Errorf("%s is an Ollama name: kiln pulls from the Hugging Face hub (ORG/NAME, such as Qwen/Qwen3-8B or Qwen/Qwen3-8B-GGUF:Q4_K_M); `ollama pull %s` puts it in Ollama's store, where kiln finds it", n, n)
		}
		return nil, nil, err
	}
	p, err := c.Hub.Pull(ctx, ref, hub.PullOptions{Progress: progress, Check: c.Check})
	if err != nil {
		return nil, nil, err
	}
	commit := p.Commit
	if commit == "" {
		commit, _ = c.Hub.Cache.Commit(ref)
	}
	m, err := hubModel(ref, commit, p.Path, c.Hub.Cache.RepoDir(ref.Repo))
	return m, p, err
}

// Remove deletes a model of the hub cache (hub.Cache.Remove) and returns
// it with the bytes freed. Models of Ollama's store and paths are refused:
// kiln deletes only what it could have downloaded.
func (c *Catalog) Remove(name string) (*Model, int64, error) {
	m, err := c.Resolve(name)
	if err != nil {
		return nil, 0, err
	}
	switch m.Source {
	case FromOllama:
		return m, 0, fmt.Errorf("%s belongs to Ollama (%s): kiln never deletes from Ollama's store; `ollama rm %s` does", m.Name, m.Where, m.Name)
	case FromPath:
		return m, 0, fmt.Errorf("%s is a path, not a model of the Hugging Face cache: kiln removes only what it can pull; delete it yourself", m.Path)
	}
	freed, err := c.Hub.Cache.Remove(m.ref)
	return m, freed, err
}

// parseOllamaOnly accepts names that are Ollama's and cannot be a hub id.
func parseOllamaOnly(name string) (string, error) {
	if strings.Contains(name, "/") && !strings.HasPrefix(name, "ollama:") {
		return "", errors.New("could be a hub id")
	}
	n, err := ollama.ParseName(strings.TrimPrefix(name, "ollama:"))
	return n.String(), err
}
