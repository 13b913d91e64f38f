// The one piece of C++ in khor's TensorFlow ops. TensorFlow's C kernel API hands an async
// kernel its "done" as the address of a std::function<void()> that lives on the caller's
// stack (tensorflow/c/kernels.cc: ComputeAsync passes &done): it dangles once
// compute_async returns, and khor completes the op later, from the engine's thread. This
// moves it to the heap while it is valid; khor_tf_done_run calls it once and frees it. Only
// std::function from libstdc++ is used, not TensorFlow's C++ ABI.
#include <functional>
#include <utility>

extern "C" void *khor_tf_done_keep(void *done)
{
	auto *f = static_cast<std::function<void()> *>(done);
	return new std::function<void()>(std::move(*f));
}

extern "C" void khor_tf_done_run(void *kept)
{
	auto *f = static_cast<std::function<void()> *>(kept);
	(*f)();
	delete f;
}
