package chimev1

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fullEvent sets every Event field, with the kind of values that trip up
// encoders: non-UTF-8 bytes, empty and duplicate headers, a non-zero nanosecond.
func fullEvent() *Event {
	return &Event{
		Id:        "order-42/reminder",
		DeliverAt: timestamppb.New(time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)),
		Delay:     durationpb.New(90 * time.Second),
		Topic:     "orders.reminders",
		Key:       []byte{0x00, 0xff, 'k'},
		Payload:   []byte("\x00payload\xff"),
		Headers: []*Header{
			{Key: "trace", Value: []byte("a")},
			{Key: "trace", Value: []byte("b")},
			{Key: "empty"},
		},
	}
}

func TestEventRoundTripsThroughBinary(t *testing.T) {
	want := fullEvent()
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	got := &Event{}
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("round trip changed the event:\n got %v\nwant %v", got, want)
	}
}

func TestEventRoundTripsThroughJSON(t *testing.T) {
	want := fullEvent()
	b, err := protojson.Marshal(want)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	got := &Event{}
	if err := protojson.Unmarshal(b, got); err != nil {
		t.Fatalf("Unmarshal %s: %v", b, err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("round trip changed the event:\n got %v\nwant %v\njson %s", got, want, b)
	}

	// What grpcurl users type: RFC 3339 times, "90s" durations, base64 bytes.
	typed := &Event{}
	in := `{"id":"x","deliverAt":"2030-01-02T03:04:05Z","delay":"90s","topic":"t","key":"AP8=","headers":[{"key":"h","value":"dg=="}]}`
	if err := protojson.Unmarshal([]byte(in), typed); err != nil {
		t.Fatalf("Unmarshal %s: %v", in, err)
	}
	if got, want := typed.GetDeliverAt().AsTime(), time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC); !got.Equal(want) {
		t.Errorf("deliverAt = %v, want %v", got, want)
	}
	if got := typed.GetDelay().AsDuration(); got != 90*time.Second {
		t.Errorf("delay = %v, want 90s", got)
	}
	if got := typed.GetKey(); string(got) != "\x00\xff" {
		t.Errorf("key = %q, want \"\\x00\\xff\"", got)
	}
}

// The server must be able to see, and reject, an event that sets both
// deliver_at and delay; a oneof would silently keep only the last one.
// (fullEvent sets both, so the round-trip tests check that both survive.)
func TestDeliverAtAndDelayAreNotAOneof(t *testing.T) {
	fields := (&Event{}).ProtoReflect().Descriptor().Fields()
	for _, name := range []protoreflect.Name{"deliver_at", "delay"} {
		f := fields.ByName(name)
		if f == nil {
			t.Fatalf("Event has no field %s", name)
		}
		if o := f.ContainingOneof(); o != nil {
			t.Errorf("Event.%s is in oneof %s", name, o.Name())
		}
	}
}

func TestSchedulerServiceHasEveryMethod(t *testing.T) {
	svc := File_chime_v1_scheduler_proto.Services().ByName("Scheduler")
	if svc == nil {
		t.Fatal("chime.v1.Scheduler is missing")
	}
	want := []struct {
		name    protoreflect.Name
		in, out protoreflect.ProtoMessage
		streams bool // from the server
	}{
		{"Schedule", &ScheduleRequest{}, &ScheduleResponse{}, false},
		{"BatchSchedule", &BatchScheduleRequest{}, &BatchScheduleResponse{}, false},
		{"Cancel", &CancelRequest{}, &CancelResponse{}, false},
		{"Get", &GetRequest{}, &GetResponse{}, false},
		{"Update", &UpdateRequest{}, &UpdateResponse{}, false},
		{"List", &ListRequest{}, &ListResponse{}, false},
		{"Count", &CountRequest{}, &CountResponse{}, false},
		{"CancelMatching", &CancelMatchingRequest{}, &CancelMatchingProgress{}, true},
		{"Forecast", &ForecastRequest{}, &ForecastResponse{}, false},
	}
	if got := svc.Methods().Len(); got != len(want) {
		t.Errorf("chime.v1.Scheduler has %d methods, want %d", got, len(want))
	}
	for _, w := range want {
		m := svc.Methods().ByName(w.name)
		if m == nil {
			t.Errorf("chime.v1.Scheduler.%s is missing", w.name)
			continue
		}
		if m.IsStreamingClient() || m.IsStreamingServer() != w.streams {
			t.Errorf("chime.v1.Scheduler.%s: streams from the client %v, from the server %v; want %v from the server only",
				w.name, m.IsStreamingClient(), m.IsStreamingServer(), w.streams)
		}
		if got, want := m.Input().FullName(), w.in.ProtoReflect().Descriptor().FullName(); got != want {
			t.Errorf("chime.v1.Scheduler.%s takes %s, want %s", w.name, got, want)
		}
		if got, want := m.Output().FullName(), w.out.ProtoReflect().Descriptor().FullName(); got != want {
			t.Errorf("chime.v1.Scheduler.%s returns %s, want %s", w.name, got, want)
		}
	}

	// The grpc-go service description is what a server registers; it must
	// agree with the descriptor.
	if got, want := Scheduler_ServiceDesc.ServiceName, string(svc.FullName()); got != want {
		t.Errorf("Scheduler_ServiceDesc.ServiceName = %q, want %q", got, want)
	}
	if got, streams := len(Scheduler_ServiceDesc.Methods), len(Scheduler_ServiceDesc.Streams); got+streams != len(want) || streams != 1 {
		t.Errorf("Scheduler_ServiceDesc has %d unary methods and %d streams, want %d methods, one of them a stream", got, streams, len(want))
	}
}
