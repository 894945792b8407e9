#pragma once
// RAII for HDF5 identifiers, and the deepest message of HDF5's error stack (which says, e.g.,
// "truncated file: eof = ..." where the top of the stack only says "unable to open file").
#include <hdf5.h>

#include <string>
#include <utility>

namespace attnprobe {

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  H5Handle& operator=(H5Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      closer_ = other.closer_;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

/// Turns off HDF5's own printing of error stacks (we report errors ourselves). Idempotent.
void silence_hdf5_errors();

/// The most specific message on the current HDF5 error stack, or "" if there is none.
std::string hdf5_error_detail();

}  // namespace attnprobe
