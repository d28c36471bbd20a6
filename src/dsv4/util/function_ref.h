// A non-owning reference to a callable, like std::function but never allocating: the
// callable must outlive the FunctionRef (true for a lambda passed down the stack, which is
// how ThreadPool::parallel_for takes its body; the forward pass calls it hundreds of times
// per token, and a std::function holding a large lambda would allocate each time).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace dsv4 {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT: implicit, as a lambda argument
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace dsv4
