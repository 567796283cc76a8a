// MarqueeStore
