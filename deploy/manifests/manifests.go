// Package manifests decodes Kubernetes manifests strictly into their
// published Go types: core objects into k8s.io/api, Istio's into
// istio.io/client-go (with the spec read by protojson, which refuses unknown
// fields, because Istio's own JSON unmarshalers accept them), Envoy
// Gateway's into github.com/envoyproxy/gateway/api/v1alpha1 and the
// Prometheus Operator's ServiceMonitor into its monitoring/v1 types. An
// unknown field, a duplicate field, a wrong type or an unknown kind is an
// error naming the document.
package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istioext "istio.io/api/extensions/v1alpha1"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest.
type Object struct {
	APIVersion, Kind, Name string
	// Value is the typed object (e.g. *appsv1.Deployment); for Istio kinds
	// an *IstioObject.
	Value any
}

// IstioObject is an Istio resource: its metadata, and its spec as the
// istio.io/api message.
type IstioObject struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	Spec proto.Message
}

// kinds maps apiVersion/kind to a new value of its Go type.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/Namespace":                            func() any { return &corev1.Namespace{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": func() any { return &egv1a1.EnvoyExtensionPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyGateway":         func() any { return &egv1a1.EnvoyGateway{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyProxy":           func() any { return &egv1a1.EnvoyProxy{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy":     func() any { return &egv1a1.EnvoyPatchPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": func() any { return &egv1a1.BackendTrafficPolicy{} },
	"gateway.networking.k8s.io/v1/Gateway":                func() any { return &gwapiv1.Gateway{} },
	"gateway.networking.k8s.io/v1/GatewayClass":           func() any { return &gwapiv1.GatewayClass{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":              func() any { return &gwapiv1.HTTPRoute{} },
}

// configKinds are configuration files in Kubernetes' shape, not API
// objects: they have no metadata.
var configKinds = map[string]bool{"gateway.envoyproxy.io/v1alpha1/EnvoyGateway": true}

// istioKinds maps Istio's apiVersion/kind to a new spec message.
var istioKinds = map[string]func() proto.Message{
	"extensions.istio.io/v1alpha1/WasmPlugin":      func() proto.Message { return &istioext.WasmPlugin{} },
	"networking.istio.io/v1alpha3/EnvoyFilter":     func() proto.Message { return &istionet.EnvoyFilter{} },
	"networking.istio.io/v1alpha3/ServiceEntry":    func() proto.Message { return &istionet.ServiceEntry{} },
	"networking.istio.io/v1/ServiceEntry":          func() proto.Message { return &istionet.ServiceEntry{} },
	"networking.istio.io/v1alpha3/DestinationRule": func() proto.Message { return &istionet.DestinationRule{} },
	"networking.istio.io/v1/DestinationRule":       func() proto.Message { return &istionet.DestinationRule{} },
}

// Split returns the YAML documents of a multi-document stream, without the
// empty ones (a template that rendered nothing, comments only).
func Split(data []byte) ([][]byte, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := yaml.Unmarshal(d, &v); err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, d)
		}
	}
}

// Decode decodes one YAML document strictly into its Go type.
func Decode(doc []byte) (Object, error) {
	var tm struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return Object{}, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	key := tm.APIVersion + "/" + tm.Kind
	o := Object{APIVersion: tm.APIVersion, Kind: tm.Kind, Name: tm.Metadata.Name}
	where := fmt.Sprintf("%s %q", key, o.Name)
	if tm.APIVersion == "" || tm.Kind == "" {
		return o, fmt.Errorf("a document without apiVersion or kind")
	}
	if o.Name == "" && !configKinds[key] {
		return o, fmt.Errorf("%s: metadata.name is empty", where)
	}
	if newSpec, ok := istioKinds[key]; ok {
		v, err := decodeIstio(doc, newSpec())
		if err != nil {
			return o, fmt.Errorf("%s: %w", where, err)
		}
		o.Value = v
		return o, nil
	}
	newObj, ok := kinds[key]
	if !ok {
		return o, fmt.Errorf("%s: unknown kind (no Go type to check it against)", where)
	}
	v := newObj()
	if err := unmarshalStrict(doc, v); err != nil {
		return o, fmt.Errorf("%s: %w", where, err)
	}
	o.Value = v
	return o, nil
}

// DecodeAll splits data and decodes every document.
func DecodeAll(data []byte) ([]Object, error) {
	docs, err := Split(data)
	if err != nil {
		return nil, err
	}
	var out []Object
	for i, d := range docs {
		o, err := Decode(d)
		if err != nil {
			return out, fmt.Errorf("document %d: %w", i+1, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// decodeIstio decodes an Istio object: the envelope strictly, the spec with
// protojson (unknown fields refused).
func decodeIstio(doc []byte, spec proto.Message) (*IstioObject, error) {
	var env struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              json.RawMessage `json:"spec"`
	}
	if err := unmarshalStrict(doc, &env); err != nil {
		return nil, err
	}
	if len(env.Spec) == 0 {
		return nil, errors.New("no spec")
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(env.Spec, spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return &IstioObject{TypeMeta: env.TypeMeta, ObjectMeta: env.ObjectMeta, Spec: spec}, nil
}

// unmarshalStrict decodes YAML into v as the API server's strict field
// validation does: duplicate keys, unknown fields and fields spelt in
// another case (rootId for rootID) are errors.
func unmarshalStrict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}
