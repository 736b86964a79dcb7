package crdregister

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
)

// Config is the cell's configuration.
type Config struct {
	// SkipCRDCreation leaves CRD management to someone else (Helm).
	SkipCRDCreation bool
}

// DefaultConfig registers the CRDs.
var DefaultConfig = Config{}

// Flags registers --skip-crd-creation (Cilium's name).
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("skip-crd-creation", def.SkipCRDCreation, "Do not create or update the cilium.io CustomResourceDefinitions")
}

func registerHook(cfg Config, cs k8s.Clientset, lc hive.Lifecycle, log *slog.Logger) {
	if cfg.SkipCRDCreation {
		log.Info("CRD creation skipped (--skip-crd-creation)")
		return
	}
	lc.Append(hive.Hook{
		Name:    "register-crds",
		Timeout: 2 * time.Minute,
		OnStart: func(ctx context.Context) error {
			if !cs.IsEnabled() {
				return fmt.Errorf("register CRDs: %w", k8s.ErrNotConfigured)
			}
			// The client no longer waits for the API server at start.
			if err := k8s.WaitForAPIServer(ctx, cs, log); err != nil {
				return fmt.Errorf("register CRDs: %w", err)
			}
			want, err := crds.All()
			if err != nil {
				return err
			}
			return Register(ctx, cs.APIExtensions().ApiextensionsV1().CustomResourceDefinitions(), want, log)
		},
	})
}

// Register creates each CRD, or updates it when its spec differs, then
// waits until every one is Established. It is idempotent.
func Register(ctx context.Context, client apiextclient.CustomResourceDefinitionInterface, want []*apiextv1.CustomResourceDefinition, log *slog.Logger) error {
	for _, crd := range want {
		if err := createOrUpdate(ctx, client, crd, log); err != nil {
			return err
		}
	}
	for _, crd := range want {
		if err := waitEstablished(ctx, client, crd.Name); err != nil {
			return err
		}
	}
	log.Info("CRDs registered and established", "count", len(want))
	return nil
}

func createOrUpdate(ctx context.Context, client apiextclient.CustomResourceDefinitionInterface, crd *apiextv1.CustomResourceDefinition, log *slog.Logger) error {
	for attempt := 0; ; attempt++ {
		cur, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case k8serrors.IsNotFound(err):
			_, err = client.Create(ctx, crd, metav1.CreateOptions{})
			if err == nil {
				log.Info("created CRD", "name", crd.Name)
				return nil
			}
			if !k8serrors.IsAlreadyExists(err) {
				return fmt.Errorf("create CRD %s: %w", crd.Name, err)
			}
		case err != nil:
			return fmt.Errorf("get CRD %s: %w", crd.Name, err)
		default:
			if equality.Semantic.DeepEqual(cur.Spec, crd.Spec) && labelsContain(cur.Labels, crd.Labels) {
				return nil
			}
			upd := cur.DeepCopy()
			upd.Spec = crd.Spec
			if upd.Labels == nil {
				upd.Labels = map[string]string{}
			}
			for k, v := range crd.Labels {
				upd.Labels[k] = v
			}
			_, err = client.Update(ctx, upd, metav1.UpdateOptions{})
			if err == nil {
				log.Info("updated CRD", "name", crd.Name)
				return nil
			}
			if !k8serrors.IsConflict(err) || attempt > 5 {
				return fmt.Errorf("update CRD %s: %w", crd.Name, err)
			}
		}
	}
}

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// waitEstablished waits until the CRD is Established and its names are
// accepted. It lists it (by name), then watches it from that list's
// resourceVersion; a closed watch or a failed call starts again after a
// short backoff. No polling.
func waitEstablished(ctx context.Context, client apiextclient.CustomResourceDefinitionInterface, name string) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	ready := func(crd *apiextv1.CustomResourceDefinition) bool {
		return crd.Name == name && condition(crd, apiextv1.Established) && condition(crd, apiextv1.NamesAccepted)
	}
	backoff := 100 * time.Millisecond
	for {
		list, err := client.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil {
			for i := range list.Items {
				if ready(&list.Items[i]) {
					return nil
				}
			}
			var w watch.Interface
			if w, err = client.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion}); err == nil {
				if untilReady(ctx, w, ready) {
					return nil
				}
				backoff = 100 * time.Millisecond // the watch worked: start over at once
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("CRD %s not Established (last error: %v): %w", name, err, ctx.Err())
			}
			return fmt.Errorf("CRD %s not Established: %w", name, ctx.Err())
		case <-time.After(backoff):
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// untilReady reads w until an object is ready (true), or w closes or ctx
// ends (false). It stops w.
func untilReady(ctx context.Context, w watch.Interface, ready func(*apiextv1.CustomResourceDefinition) bool) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false
			}
			if crd, isCRD := ev.Object.(*apiextv1.CustomResourceDefinition); isCRD && ev.Type != watch.Deleted && ready(crd) {
				return true
			}
		}
	}
}

func condition(crd *apiextv1.CustomResourceDefinition, t apiextv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == t && c.Status == apiextv1.ConditionTrue {
			return true
		}
	}
	return false
}
