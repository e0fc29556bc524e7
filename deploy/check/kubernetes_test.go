package check

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/health"
)

const manifestsDir = "../kubernetes"

// kustomization is the part of kustomize's Kustomization these manifests
// use; decoded strictly, so a field added to kustomization.yaml must be
// added here (and checked).
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// manifests are the decoded resources of the kustomization.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
	accounts    map[string]*corev1.ServiceAccount
}

// decodeStrict decodes one YAML document into out, refusing unknown or
// duplicate fields: a misspelt field (readinesProbe) is an error, not a
// silently ignored setting.
func decodeStrict(doc []byte, out any) error {
	return yaml.UnmarshalStrict(doc, out)
}

func loadManifests(t *testing.T) manifests {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(manifestsDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := decodeStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	files, err := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk []string
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			onDisk = append(onDisk, filepath.Base(f))
		}
	}
	listed := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(listed, onDisk) {
		t.Errorf("kustomization resources %v differ from the files %v", listed, onDisk)
	}
	m := manifests{configMaps: map[string]*corev1.ConfigMap{}, accounts: map[string]*corev1.ServiceAccount{}}
	for _, name := range k.Resources {
		b, err := os.ReadFile(filepath.Join(manifestsDir, name))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s #%d: %v", name, i, err)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, d), d
			case "v1 Service":
				s := &corev1.Service{}
				m.services, obj = append(m.services, s), s
			case "v1 ConfigMap":
				c := &corev1.ConfigMap{}
				obj = c
				defer func() { m.configMaps[c.Name] = c }()
			case "v1 ServiceAccount":
				a := &corev1.ServiceAccount{}
				obj = a
				defer func() { m.accounts[a.Name] = a }()
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, p), p
			default:
				t.Fatalf("%s #%d: %s %s is not a kind this check knows; add it", name, i, meta.APIVersion, meta.Kind)
			}
			if err := decodeStrict(doc, obj); err != nil {
				t.Fatalf("%s #%d (%s): %v", name, i, meta.Kind, err)
			}
		}
	}
	return m
}

// settings are the environment variables the service reads
// (internal/config), with whether each is required.
func settings() map[string]bool {
	out := map[string]bool{}
	typ := reflect.TypeOf(config.Config{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if name := f.Tag.Get("envconfig"); name != "" {
			out[name] = f.Tag.Get("required") == "true"
		}
	}
	return out
}

// containerEnv is a container's environment as the pod sees it: its
// envFrom ConfigMaps, then its env (which wins).
func containerEnv(t *testing.T, m manifests, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil || from.Prefix != "" {
			t.Errorf("container %s: only envFrom of a ConfigMap without prefix is checked", c.Name)
			continue
		}
		cm, ok := m.configMaps[from.ConfigMapRef.Name]
		if !ok {
			t.Errorf("container %s: envFrom ConfigMap %s is not in the kustomization", c.Name, from.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Errorf("container %s: %s comes from valueFrom; secrets must be mounted as files (*_FILE settings)", c.Name, e.Name)
			continue
		}
		env[e.Name] = e.Value
	}
	return env
}

// TestKubernetesManifests validates deploy/kubernetes offline.
func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	known := settings()
	if len(m.deployments) != 1 || len(m.pdbs) != 1 || len(m.services) != 1 {
		t.Fatalf("want one Deployment, one PodDisruptionBudget and one Service; got %d, %d, %d", len(m.deployments), len(m.pdbs), len(m.services))
	}
	d := m.deployments[0]
	pod := d.Spec.Template.Spec
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1LabelSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("the Deployment's selector does not match its pods' labels: %v", err)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the pod does not require a non-root user (runAsNonRoot)")
	}
	if pod.ServiceAccountName != "" {
		if _, ok := m.accounts[pod.ServiceAccountName]; !ok {
			t.Errorf("service account %s is not in the kustomization", pod.ServiceAccountName)
		}
	}
	secretMounts := map[string]string{} // volume name -> secret
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secretMounts[v.Name] = v.Secret.SecretName
		}
	}

	var main *corev1.Container
	for i, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		env := containerEnv(t, m, c)
		for name, value := range env {
			if _, ok := known[name]; !ok {
				t.Errorf("container %s: %s is not a setting of the service (internal/config)", c.Name, name)
			}
			// Secrets as files: a *_FILE setting names a file under a
			// mounted Secret volume.
			if strings.HasSuffix(name, "_FILE") && value != "" {
				if !underSecretMount(c, secretMounts, value) {
					t.Errorf("container %s: %s=%s is not under a mounted Secret volume", c.Name, name, value)
				}
			}
			if strings.Contains(strings.ToUpper(name), "PASSWORD") && !strings.HasSuffix(name, "_FILE") {
				t.Errorf("container %s: %s holds a secret in the environment; use %s_FILE", c.Name, name, name)
			}
		}
		for name, required := range known {
			if _, ok := env[name]; required && !ok {
				t.Errorf("container %s: required setting %s is not set", c.Name, name)
			}
		}
		if dsn, ok := env["MYSQL_DSN"]; ok && strings.Contains(strings.SplitN(dsn, "@", 2)[0], ":") {
			t.Errorf("container %s: MYSQL_DSN carries a password; use MYSQL_PASSWORD_FILE", c.Name)
		}
		checkEnvLoads(t, c.Name, env)
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: want readOnlyRootFilesystem: true and allowPrivilegeEscalation: false", c.Name)
		}
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: capabilities are not all dropped", c.Name)
		}
		if c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: no memory limit", c.Name)
		}
		if i >= len(pod.InitContainers) && c.Name == "billing" {
			main = &pod.Containers[i-len(pod.InitContainers)]
		}
	}
	if len(pod.InitContainers) != 1 || !slices.Equal(pod.InitContainers[0].Args, []string{"migrate"}) {
		t.Errorf("want one init container running `billing migrate`, got %+v", pod.InitContainers)
	}
	if main == nil {
		t.Fatal("no container named billing")
	}
	if len(main.Args) != 0 && !slices.Equal(main.Args, []string{"run"}) {
		t.Errorf("the billing container runs %v, want the service (no args or run)", main.Args)
	}
	env := containerEnv(t, m, *main)

	// Probes: on real endpoints, on the port HTTP_ADDR listens on.
	httpPort := 8080
	if addr, ok := env["HTTP_ADDR"]; ok {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("HTTP_ADDR %q: %v", addr, err)
		}
		fmt.Sscan(p, &httpPort)
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startupProbe", main.StartupProbe, health.PathHealthz},
		{"livenessProbe", main.LivenessProbe, health.PathHealthz},
		{"readinessProbe", main.ReadinessProbe, health.PathReadyz},
	} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: missing, or not an httpGet probe", pr.name)
			continue
		}
		g := pr.probe.HTTPGet
		if !slices.Contains(health.Paths(), g.Path) {
			t.Errorf("%s: path %s is not an endpoint of the service %v", pr.name, g.Path, health.Paths())
		}
		if g.Path != pr.path {
			t.Errorf("%s: path %s, want %s", pr.name, g.Path, pr.path)
		}
		if port := containerPort(*main, g.Port); port != httpPort {
			t.Errorf("%s: port %s is %d, but HTTP_ADDR listens on %d", pr.name, g.Port.String(), port, httpPort)
		}
	}
	// The liveness probe must not kill an instance before it could have
	// been judged wedged.
	if lp := main.LivenessProbe; lp != nil {
		if tolerance := time.Duration(lp.PeriodSeconds*lp.FailureThreshold) * time.Second; tolerance > 5*time.Minute {
			t.Errorf("liveness tolerates %s of failures: a wedged instance keeps its partitions that long", tolerance)
		}
	}

	// Memory: the service is sized for 512 MiB (GOMEMLIMIT 400 MiB when unset).
	if lim := main.Resources.Limits.Memory(); lim.Cmp(resource.MustParse("512Mi")) != 0 {
		t.Errorf("memory limit %s, want 512Mi (the bound the service keeps its RSS under)", lim)
	}
	if req := main.Resources.Requests.Memory(); req.Cmp(*main.Resources.Limits.Memory()) != 0 {
		t.Errorf("memory request %s differs from the limit: the pod could be placed where 512Mi is not free", req)
	}
	// The grace period exceeds SHUTDOWN_TIMEOUT.
	shutdown := 30 * time.Second
	if s, ok := env["SHUTDOWN_TIMEOUT"]; ok {
		if shutdown, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v does not exceed SHUTDOWN_TIMEOUT %s", g, shutdown)
	}

	// The PodDisruptionBudget and the Service select these pods.
	pdb := m.pdbs[0]
	if s, err := metav1LabelSelector(pdb.Spec.Selector); err != nil || !s.Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget does not select the pods: %v", err)
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("the PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	svc := m.services[0]
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Error("the metrics Service does not select the pods")
	}
	for _, p := range svc.Spec.Ports {
		if containerPort(*main, p.TargetPort) != httpPort {
			t.Errorf("Service port %s targets %s, not the HTTP port %d", p.Name, p.TargetPort.String(), httpPort)
		}
	}
}

// containerPort resolves a probe's or a Service's port (a number or a
// port name) in a container; 0 when it does not resolve.
func containerPort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

func underSecretMount(c corev1.Container, secretVolumes map[string]string, path string) bool {
	for _, vm := range c.VolumeMounts {
		if _, ok := secretVolumes[vm.Name]; ok && strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

// checkEnvLoads loads the service's configuration from env (the *_FILE
// paths replaced by files that exist): the manifests' settings must pass
// the service's own validation, relations between settings included.
func checkEnvLoads(t *testing.T, container string, env map[string]string) {
	t.Helper()
	for name := range settings() {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
	dir := t.TempDir()
	for k, v := range env {
		if strings.HasSuffix(k, "_FILE") && v != "" {
			f := filepath.Join(dir, k)
			if err := os.WriteFile(f, []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			v = f
		}
		t.Setenv(k, v)
	}
	if _, err := config.Load(); err != nil {
		t.Errorf("container %s: the service would refuse these settings: %v", container, err)
	}
}
